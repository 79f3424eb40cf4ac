"""The stall watchdog: a WebLoader worker that produces nothing for ``timeout`` seconds is
reported, with the shard URL and byte offset its reader last read and, when the loader
profiles (``profile=True``), the stage it is in.

Each worker (or the main process, with ``num_workers=0``) runs a daemon thread that looks at
the worker's output count a few times per ``timeout``; it never touches the pipeline, so a
worker stuck in a read, a decoder or a user function is reported all the same. A stall is
reported once, and again for every further ``timeout`` it lasts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from wdsx.stages.observe import StageObserver

log = logging.getLogger("wdsx")


class Watchdog:
    """Watches ``produced()`` (a worker's output count) and reports when it stops moving."""

    def __init__(
        self,
        timeout: float,
        worker: int,
        produced: Callable[[], int],
        observer: StageObserver,
        report: Callable[[str], None] | None = None,
    ):
        self.timeout = timeout
        self.worker = worker
        self.produced = produced
        self.observer = observer
        self.report = report or log.warning
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, name=f"wdsx-watchdog-{worker}", daemon=True)

    def start(self) -> Watchdog:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def _watch(self) -> None:
        last, since, read_then = self.produced(), time.monotonic(), self.observer.read
        reported = 0.0
        while not self.stopped.wait(min(1.0, self.timeout / 4)):
            now, count = time.monotonic(), self.produced()
            if count != last:
                last, since, read_then, reported = count, now, self.observer.read, 0.0
                continue
            stalled = now - since
            if stalled - reported >= self.timeout:
                reported = stalled
                self.report(self.describe(stalled, self.observer.read - read_then))

    def describe(self, stalled: float, read_since: int) -> str:
        """The report of a stall of ``stalled`` seconds during which ``read_since`` samples
        were read."""
        who = f"wdsx worker {self.worker}" if self.worker >= 0 else "wdsx loader"
        text = f"{who} has produced nothing for {stalled:.0f} s"
        position = self.observer.last_read
        if isinstance(position, list):  # a reader that hands out whole batches
            position = position[-1] if position else None
        if position is None:
            text += "; its reader has not read a sample yet"
        else:
            text += f"; its reader last read the sample at byte {position[1]} of {position[0]}"
            text += (
                f" ({read_since} samples read since its last output)"
                if read_since
                else " and has read nothing since its last output"
            )
        stage = self.observer.running_label()
        if stage:
            text += f"; running stage: {stage}"
        return text
