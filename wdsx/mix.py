"""webdataset's ``mix`` module: ``RandomMix`` and ``RoundRobin``, here faces of wdsx's
seeded, exactly resumable :class:`~wdsx.pipeline.mixing.Mix`."""

from wdsx.pipeline.mixing import Mix, RandomMix, RoundRobin

__all__ = ["Mix", "RandomMix", "RoundRobin"]
