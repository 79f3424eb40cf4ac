"""Where a WebLoader's time goes: per stage in the workers, collating, handing batches over,
and on the main side, waiting for data versus waiting for the trainer.

Workers send, with every batch, what they spent since their previous batch (a few numbers);
the main process adds them up. Per-stage times need ``WebLoader(..., profile=True)`` (they
cost about a microsecond per item per stage); the rest is always measured, per batch.

``loader.stats()`` returns a :class:`LoaderStats`; ``print(loader.stats())`` shows a table.
Worker times are CPU-bound work summed over all workers, so with W workers they can add up to
W times the wall time; ``waiting for data`` and ``in the trainer`` are wall time in the main
process. A loader that keeps up has its trainer, not its workers, as the larger of the two.
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from dataclasses import dataclass, field
from typing import Any

from wdsx.loader.watchdog import Watchdog
from wdsx.stages.observe import StageObserver

StageTimes = dict[str, tuple[float, int]]
"""Seconds and items per stage label."""


@dataclass
class WorkerReport:
    """What one worker spent between two of its batches."""

    stages: StageTimes
    collate: float
    transport: float


@dataclass
class LoaderStats:
    """A WebLoader's time, summed since it was created (or :meth:`reset`)."""

    batches: int = 0
    stages: StageTimes = field(default_factory=dict)
    collate: float = 0.0
    """Seconds workers spent in the DataLoader's collate function (``batch_size=None``:
    converting to tensors), summed over workers."""
    transport: float = 0.0
    """Seconds workers spent placing batches in shared memory, summed over workers."""
    waiting_for_data: float = 0.0
    """Seconds the main process waited for the next batch (includes receiving it)."""
    in_trainer: float = 0.0
    """Seconds between handing a batch over and being asked for the next one: the training
    step and any main-process stages after the loader."""
    stalls: list[str] = field(default_factory=list)
    """Stall reports of the workers (each also logged where it happened)."""

    def add(self, report: WorkerReport) -> None:
        self.batches += 1
        self.collate += report.collate
        self.transport += report.transport
        for label, (seconds, items) in report.stages.items():
            total = self.stages.get(label, (0.0, 0))
            self.stages[label] = (total[0] + seconds, total[1] + items)

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    def rows(self) -> list[tuple[str, float, int | None]]:
        """``(what, seconds, items)`` rows: stages (in pipeline order), then the loader's parts."""
        rows: list[tuple[str, float, int | None]] = [
            (label, seconds, items) for label, (seconds, items) in self.stages.items()
        ]
        rows += [
            ("collate (DataLoader)", self.collate, self.batches),
            ("transport (to shared memory)", self.transport, self.batches),
            ("main: waiting for data", self.waiting_for_data, self.batches),
            ("main: in the trainer", self.in_trainer, self.batches),
        ]
        return rows

    def __str__(self) -> str:
        lines = [f"{'where':<60} {'seconds':>9} {'items':>8} {'ms/item':>8}"]
        for what, seconds, items in self.rows():
            per = f"{1000 * seconds / items:8.3f}" if items else f"{'':8}"
            lines.append(f"{what[:60]:<60} {seconds:9.3f} {items or '':>8} {per}")
        if not self.stages:
            lines.append("(per-stage times: WebLoader(..., profile=True))")
        lines += [f"stall: {report}" for report in self.stalls]
        return "\n".join(lines)


class Clock:
    """Splits the main process's time between waiting for batches and the trainer's turn."""

    def __init__(self, stats: LoaderStats):
        self.stats = stats
        self.mark = time.perf_counter()

    def received(self) -> None:
        now = time.perf_counter()
        self.stats.waiting_for_data += now - self.mark
        self.mark = now

    def resumed(self) -> None:
        now = time.perf_counter()
        self.stats.in_trainer += now - self.mark
        self.mark = now


HEAD_START = 1.0
"""Seconds the other workers wait for worker 0's first batch before starting anyway."""


class LoaderWatch:
    """What a WebLoader shares with its workers: settings (profiling, stall timeout, decoding
    threads), the channel they send stall reports back on, and worker 0's head start: the
    first batch comes from worker 0, and all workers decoding their first batch at once would
    make it wait for all of them, so the others start once it is out (or after
    :data:`HEAD_START` seconds). In the main process, the statistics."""

    def __init__(self, profile: bool, stall_timeout: float | None, decode_threads: int = 1):
        self.profile = profile
        self.stall_timeout = stall_timeout
        self.decode_threads = decode_threads
        self.stats = LoaderStats()
        self.channel: Any = None
        self.first_out: Any = None

    def open(self, context: Any, workers: int) -> None:
        """Before starting ``workers`` worker processes with multiprocessing ``context``."""
        context = multiprocessing.get_context(context) if isinstance(context, str | None) else context
        if self.stall_timeout and workers > 0 and self.channel is None:
            self.channel = context.SimpleQueue()
        self.first_out = context.Event() if workers > 1 else None

    def collect(self) -> None:
        """Take in the stall reports workers have sent."""
        channel = self.channel
        while channel is not None and not channel.empty():
            self.stats.stalls.append(channel.get())

    def worker(self, dataset: Any, worker: int, in_process: bool) -> WorkerSide:
        """Start watching ``dataset`` (a pipeline about to run in a worker; ``in_process``:
        in the main process, with ``num_workers=0``)."""
        if worker > 0:
            self.wait_for_first()
        observer = StageObserver(timing=self.profile)
        dataset.observer = observer
        side = WorkerSide(observer, self.first_out if worker == 0 else None)
        if self.stall_timeout:
            stalls, channel = self.stats.stalls, self.channel

            def report(text: str) -> None:
                # Recorded before it is logged: whoever the log wakes finds it in the stats.
                if in_process:
                    stalls.append(text)
                elif channel is not None:
                    channel.put(text)
                logging.getLogger("wdsx").warning(text)

            side.watchdog = Watchdog(
                self.stall_timeout, -1 if in_process else worker, side.count, observer, report
            ).start()
        return side

    def wait_for_first(self) -> None:
        """In a worker other than worker 0: wait for worker 0's first batch (bounded)."""
        if self.first_out is not None:
            self.first_out.wait(HEAD_START)


class WorkerSide:
    """A worker's side: counts what it produces (for the watchdog) and turns its observer's
    running totals into per-batch reports."""

    def __init__(self, observer: StageObserver, first_out: Any = None):
        self.observer = observer
        self.produced = 0
        self.sent: StageTimes = {}
        self.watchdog: Watchdog | None = None
        self.first_out = first_out
        """Worker 0's signal that its first batch is out (:class:`LoaderWatch`)."""

    def out(self) -> None:
        """A batch has been handed over: worker 0 lets the other workers start."""
        if self.first_out is not None:
            self.first_out.set()
            self.first_out = None

    def count(self) -> int:
        return self.produced

    def report(self, collate: float, transport: float) -> WorkerReport:
        """What the worker spent since its previous report."""
        now = self.observer.snapshot() if self.observer.timing else {}
        delta = {}
        for label, (seconds, items) in now.items():
            before = self.sent.get(label, (0.0, 0))
            delta[label] = (seconds - before[0], items - before[1])
        self.sent = now
        return WorkerReport(delta, collate, transport)

    def close(self) -> None:
        self.out()
        if self.watchdog is not None:
            self.watchdog.stop()
