"""webdataset's ``mix`` module: ``RandomMix`` and ``RoundRobin``, here faces of wdsx's
seeded, exactly resumable :class:`~wdsx.pipeline.mixing.Mix`, and webdataset's plain
interleaving generators."""

from wdsx.core.faces import torch_names
from wdsx.pipeline.mixing import Mix, RandomMix, RoundRobin
from wdsx.stages.interleave import random_samples, round_robin_longest, round_robin_shortest

__getattr__ = torch_names(__name__)

__all__ = ["Mix", "RandomMix", "RoundRobin", "random_samples", "round_robin_longest", "round_robin_shortest"]
