"""webdataset's plain interleaving generators (``webdataset.mix``): round robin over iterators,
and random choice between them.

They keep no state and are not resumable; :class:`~wdsx.pipeline.mixing.RandomMix` and
:class:`~wdsx.pipeline.mixing.RoundRobin` are the seeded, exactly resumable mixers.
``random_samples`` draws from Python's global ``random`` module, as webdataset's does, so a
program that calls ``random.seed(n)`` first gets webdataset's sequence.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np


def round_robin_shortest(*sources: Iterator) -> Iterator:
    """One item from each source in turn, until any source is exhausted."""
    turn = 0
    while True:
        try:
            item = next(sources[turn % len(sources)])
        except StopIteration:
            return
        yield item
        turn += 1


def round_robin_longest(*sources: Iterator) -> Iterator:
    """One item from each source in turn, dropping sources as they are exhausted, until none
    is left."""
    remaining = list(sources)
    turn = 0
    while remaining:
        turn %= len(remaining)
        try:
            item = next(remaining[turn])
        except StopIteration:
            del remaining[turn]
            continue
        turn += 1
        yield item


def random_samples(
    sources: list[Iterator], probs: Sequence[float] | None = None, longest: bool = False
) -> Iterator:
    """Items from sources chosen at random with probabilities ``probs`` (equal by default).
    When the chosen source is exhausted: stop, or with ``longest`` drop it and go on. Like
    webdataset's, it deletes exhausted sources from the ``sources`` list it is given."""
    weights: list[Any] = [1] * len(sources) if probs is None else list(probs)
    while sources:
        cumulative = (np.array(weights) / np.sum(weights)).cumsum()
        chosen = int(np.searchsorted(cumulative, random.random()))
        try:
            yield next(sources[chosen])
        except StopIteration:
            if not longest:
                return
            del sources[chosen]
            del weights[chosen]
