"""Watching a pipeline run: where its time goes, stage by stage, and where its reader is.

A :class:`StageObserver` given to a pipeline (``DataPipeline.observer``) wraps the iterator
each stage returns. It always records the position of the last sample the reading stage
produced (for the stall watchdog's report); with ``timing=True`` it also measures how long
each stage takes to produce its items and which stage is running at any moment. A stage's own
time is the time spent in its ``next()`` minus the time its upstream spent producing what it
pulled; since every upstream pull happens inside a downstream ``next()``, that is the
difference of the two stages' totals. Timing costs about a microsecond per item per stage,
which is why it is off unless asked for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from wdsx.stages.base import Run, Stage


class StageObserver:
    """Per-stage totals of one pipeline in one process, and the reader's last position."""

    def __init__(self, timing: bool = False):
        self.timing = timing
        self.labels: list[str] = []
        self.seconds: list[float] = []
        self.items: list[int] = []
        self.running: int | None = None
        """Index of the stage whose ``next()`` is executing (innermost), when timing."""
        self.read = 0
        """Samples the reading stage has produced."""
        self.last_read: Any = None
        """The position of the last of them (a Position, or None before the first)."""

    def start(self, stages: Sequence[Stage]) -> None:
        """Begin an epoch of ``stages`` (the totals carry on when they are the same stages)."""
        labels = [stage.describe() for stage in stages]
        if labels != self.labels:
            self.labels = labels
            self.seconds = [0.0] * len(labels)
            self.items = [0] * len(labels)

    def wrap(self, chain: Iterator, run: Run, index: int) -> Iterator:
        """Stage ``index``'s output, observed."""
        if index == run.source_index:
            chain = self._probe(chain, run)
        return self._timed(chain, index) if self.timing else chain

    def _probe(self, chain: Iterator, run: Run) -> Iterator:
        for item in chain:
            self.read += 1
            self.last_read = run.position
            yield item

    def _timed(self, chain: Iterator, index: int) -> Iterator:
        clock, seconds, items = time.perf_counter, self.seconds, self.items
        while True:
            outer, self.running = self.running, index
            began = clock()
            try:
                item = next(chain)
            except StopIteration:
                return
            finally:
                seconds[index] += clock() - began
                self.running = outer
            items[index] += 1
            yield item

    def own_seconds(self) -> list[float]:
        """Each stage's time without its upstream's."""
        return [total - (self.seconds[i - 1] if i else 0.0) for i, total in enumerate(self.seconds)]

    def snapshot(self) -> dict[str, tuple[float, int]]:
        """Each stage's own seconds and items so far, by label (stages that only pass items
        through, left behind by :mod:`wdsx.stages.plan`, have no label and are left out)."""
        result: dict[str, tuple[float, int]] = {}
        for label, own, count in zip(self.labels, self.own_seconds(), self.items):
            if not label:
                continue
            seconds, items = result.get(label, (0.0, 0))
            result[label] = (seconds + own, items + count)
        return result

    def running_label(self) -> str | None:
        """The label of the stage executing now, when timing."""
        index = self.running
        return None if index is None or index >= len(self.labels) else self.labels[index]
