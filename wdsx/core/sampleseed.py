"""The seed of one sample's own randomness: a pure function of (pipeline seed, epoch, sample
key, padding repeat).

An augmentation that draws from a generator seeded this way gives a sample the same crop or
flip whichever worker or rank reads it, whatever was read before it, and after any resume.

A map sees only the sample, while the pipeline seed and the epoch belong to the run that read
it. So readers stamp every sample with one integer, :data:`EPOCH_SEED` (a function of seed and
epoch), as they stamp its position; samples read again to refill a buffer after a resume are
stamped alike. The key and the padding flag are in the sample already.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from wdsx.core.rng import derive_seed

EPOCH_SEED = "__epoch_seed__"
"""Sample field holding :func:`epoch_seed` of the run that read the sample (None when a resumed
run cannot know the epoch a re-read sample belonged to)."""


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed every sample of ``epoch`` of a pipeline seeded ``seed`` starts from. Below
    2**63, so that batches of samples collate it into an int64 tensor."""
    return derive_seed("sample-rng", seed, epoch) >> 1


def stamp(samples: Iterable[Any], value: int | None) -> None:
    """Give every sample dict among ``samples`` the epoch seed ``value``."""
    for sample in samples:
        if isinstance(sample, dict):
            sample[EPOCH_SEED] = value


def sample_seed(sample: Mapping[str, Any]) -> int:
    """A 64-bit seed that depends only on the sample's epoch seed, key and padding flag.

    Raises ``TypeError`` for anything but a sample dict, and ``ValueError`` for a dict that
    lacks what the seed is made of (saying what to change)."""
    if not isinstance(sample, Mapping):
        raise TypeError(
            f"per-sample randomness needs the sample dict, not a {type(sample).__name__}: draw it in a "
            "map() before to_tuple() or batched()"
        )
    if "__key__" not in sample:
        raise ValueError("the sample has no __key__ (a map returned a new dict without it?)")
    if EPOCH_SEED not in sample:
        raise ValueError(
            f"sample {sample['__key__']!r} has no {EPOCH_SEED}: only samples read by a wdsx reader "
            "(WebDataset, tarfile_to_samples) carry one, and a map that builds a new dict must copy it"
        )
    value = sample[EPOCH_SEED]
    if value is None:
        raise ValueError(
            f"sample {sample['__key__']!r} was re-read for a buffer whose epoch cannot be known "
            "(a main-process buffer over a with_epoch() or repeat() dataset, or a buffer after a Mix): "
            "draw per-sample randomness after that buffer"
        )
    return derive_seed(int(value), sample["__key__"], bool(sample.get("__pad__", False)))
