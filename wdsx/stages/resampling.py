"""``resampled(n)``: draw ``n`` items with replacement from everything the stream holds.

webdataset's functional form (``DataPipeline(SimpleShardList(urls), resampled(10), ...)``)
collects the upstream items, then yields random choices among them. webdataset seeds it from
``/dev/random``, so every run differs; wdsx draws from the pipeline's seed, the epoch and the
reader, so a run can be repeated and, placed before the shard reader, resumed exactly.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator

from wdsx.core import rng
from wdsx.stages.base import Run, Stage


class Resampled(Stage):
    """Collect the upstream items and yield ``n`` of them drawn with replacement."""

    def __init__(self, n: int = sys.maxsize):
        self.n = n

    def describe(self) -> str:
        return f"resampled(n={self.n})"

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        if index == 0:
            raise ValueError("resampled() draws from the items before it; it cannot start a pipeline")
        return self._draws(
            list(upstream), rng.derive_seed("resampled", run.seed, run.epoch, run.topology.consumer)
        )

    def _draws(self, items: list, stream: int) -> Iterator:
        if not items:
            raise IndexError("resampled(): the stream before it yielded nothing to draw from")
        for draw in range(self.n):
            yield items[rng.below(stream, draw, len(items))]

    def not_resumable(self) -> str | None:
        return "resampled() holds every item of its input; place it before the shard reader to resume exactly"


def resampled(n: int = sys.maxsize) -> Resampled:
    """The stage drawing ``n`` items with replacement (webdataset's ``resampled``)."""
    return Resampled(n)


def resampled_(src: Iterable, n: int = sys.maxsize) -> Iterator:
    """``n`` items drawn with replacement from the items of ``src`` (plain-iterator form)."""
    return Resampled(n)(src)
