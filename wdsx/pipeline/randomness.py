"""Random generators for augmentations that depend on the sample alone.

``wdsx.sample_rng(sample)`` in a map gives a generator seeded from (pipeline seed, epoch,
sample key, padding repeat) only (:mod:`wdsx.core.sampleseed`). A crop or flip drawn from it is
the same on any number of workers and ranks, and after a resume (the stages before a buffer
are replayed on restore, so their randomness must come from the sample), while each epoch
draws anew::

    def augment(sample):
        rng = wdsx.sample_rng(sample)
        top, left = rng.integers(0, 4, size=2)
        sample["png"] = sample["png"][top : top + 24, left : left + 24]
        return sample
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from wdsx.core.sampleseed import sample_seed

if TYPE_CHECKING:
    import torch


@overload
def sample_rng(sample: Mapping[str, Any], kind: Literal["numpy"] = "numpy") -> np.random.Generator: ...


@overload
def sample_rng(sample: Mapping[str, Any], kind: Literal["torch"]) -> torch.Generator: ...


def sample_rng(sample: Mapping[str, Any], kind: str = "numpy") -> np.random.Generator | torch.Generator:
    """A fresh random generator for ``sample`` (a sample dict as a reader made it, or a map's
    copy that kept ``__key__`` and ``__epoch_seed__``): a NumPy ``Generator``, or with
    ``kind="torch"`` a CPU ``torch.Generator``. Every call for the same sample in the same
    epoch starts the same stream."""
    seed = sample_seed(sample)
    if kind == "numpy":
        return np.random.Generator(np.random.PCG64(seed))
    if kind == "torch":
        import torch

        generator = torch.Generator()
        generator.manual_seed(seed)
        return generator
    raise ValueError(f"kind must be 'numpy' or 'torch', not {kind!r}")
