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

A function that sees only a field (an image in ``map_tuple``) cannot name its sample, so the
stages made with ``rng=True`` (``.map_tuple(augment, identity, rng=True)``, ``.map(f, rng=True)``;
:mod:`wdsx.pipeline.samplemaps`) give it one while it runs: ``wdsx.current_rng()``. Its seed is
a pure function of the pipeline seed, the epoch, the sample's position (shard URL, ordinal,
padding repeat) and the stage, so it too is the same on any topology and after a resume::

    def augment(image):
        return image[::-1] if wdsx.current_rng().random() < 0.5 else image

    dataset = WebDataset(urls).decode("rgb8").to_tuple("png", "cls").map_tuple(augment, None, rng=True)
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from wdsx.core.rng import derive_seed
from wdsx.core.sampleseed import EPOCH_SEED, sample_seed
from wdsx.read.samples import POSITION

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
    return _generator(sample_seed(sample), kind)


def _generator(seed: int, kind: str) -> np.random.Generator | torch.Generator:
    """A NumPy or torch generator seeded with ``seed``."""
    if kind == "numpy":
        return np.random.Generator(np.random.PCG64(seed))
    if kind == "torch":
        import torch

        generator = torch.Generator()
        generator.manual_seed(seed)
        return generator
    raise ValueError(f"kind must be 'numpy' or 'torch', not {kind!r}")


class ItemDraws:
    """What ``current_rng()`` draws from while one item is being mapped: the item's seed
    material, turned into a seed and a generator only when the function asks for one (most
    items of a pipeline with a random branch never do). One generator per kind per item, so
    that successive draws for the same item continue one stream."""

    __slots__ = ("epoch_seed", "where", "salt", "generators")

    def __init__(self, epoch_seed: int | None, where: Any, salt: int):
        self.epoch_seed = epoch_seed
        self.where = where
        self.salt = salt
        self.generators: dict[str, Any] = {}

    def generator(self, kind: str) -> Any:
        found = self.generators.get(kind)
        if found is None:
            found = self.generators[kind] = _generator(self.seed(), kind)
        return found

    def seed(self) -> int:
        if self.where is None:
            raise RuntimeError(
                "wdsx.current_rng(): the item being mapped has no position (it was not read by a "
                "wdsx reader, or a buffer re-read it without its sample)"
            )
        if self.epoch_seed is None:
            raise ValueError(
                "wdsx.current_rng(): the item was re-read for a buffer whose epoch cannot be known "
                "(a main-process buffer over a with_epoch() or repeat() dataset, or a buffer after a "
                "Mix): apply the random map after that buffer"
            )
        positions = self.where if isinstance(self.where, list) else [self.where]
        parts = [(p.url, p.ordinal, bool(p.pad)) for p in positions if p is not None]
        return derive_seed("item-rng", self.epoch_seed, self.salt, *parts)


_CURRENT: ContextVar[ItemDraws | None] = ContextVar("wdsx_current_rng", default=None)
_REPLAYED: ContextVar[tuple[int | None, Any] | None] = ContextVar("wdsx_replayed_sample", default=None)


@overload
def current_rng(kind: Literal["numpy"] = "numpy") -> np.random.Generator: ...


@overload
def current_rng(kind: Literal["torch"]) -> torch.Generator: ...


def current_rng(kind: str = "numpy") -> np.random.Generator | torch.Generator:
    """The random generator of the item being mapped, inside a function that a stage made with
    ``rng=True`` is applying (``map_tuple(augment, None, rng=True)``): a NumPy ``Generator``,
    or with ``kind="torch"`` a CPU ``torch.Generator``. The same item in the same epoch and
    stage always gets the same stream; calls while mapping one item continue that stream."""
    if kind not in ("numpy", "torch"):
        raise ValueError(f"kind must be 'numpy' or 'torch', not {kind!r}")
    draws = _CURRENT.get()
    if draws is None:
        raise RuntimeError(
            "wdsx.current_rng() is only valid while a stage made with rng=True maps an item: "
            "use .map_tuple(..., rng=True) or .map(f, rng=True)"
        )
    return draws.generator(kind)


def drawing(draws: ItemDraws) -> Token:
    """Make ``draws`` what ``current_rng()`` draws from, until :func:`done_drawing`."""
    return _CURRENT.set(draws)


def done_drawing(token: Token) -> None:
    _CURRENT.reset(token)


def remember_replayed(sample: Any) -> None:
    """Note the sample dict that a buffer's restore is replaying through the stages now, so
    that a random map later in the same replay, which sees only a tuple, finds its position
    and epoch seed."""
    if isinstance(sample, dict):
        _REPLAYED.set((sample.get(EPOCH_SEED), sample.get(POSITION)))
    else:
        _REPLAYED.set(None)


def replayed_sample() -> tuple[int | None, Any]:
    """The epoch seed and position that :func:`remember_replayed` noted last (None, None when
    no sample was noted)."""
    return _REPLAYED.get() or (None, None)
