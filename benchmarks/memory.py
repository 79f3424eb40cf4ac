"""Peak memory of this process and every process it started, as PSS (proportional set size).

PSS charges each page to the processes that map it in equal parts, so the PSS of a process
tree is what the tree costs the machine: forked workers that share the trainer's imported
libraries are not counted once per worker, as RSS would count them. Linux only (it reads
``/proc/<pid>/smaps_rollup``); elsewhere :class:`PeakPss` measures nothing and reports None.

    with PeakPss() as peak:
        for batch in loader:
            ...
    print(peak.megabytes)
"""

from __future__ import annotations

import os
import threading
from types import TracebackType

INTERVAL = 0.02
"""Seconds between two samples of the tree's memory."""


def _children(pid: int) -> list[int]:
    """The pids of the live children of ``pid`` (their threads' children included)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found += [int(child) for child in children.read().split()]
        except OSError:
            continue
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and every live process it started, directly or not."""
    pids: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        pending += _children(current)
    return pids


def pss_kib(pid: int) -> int:
    """The process's PSS in KiB; 0 for a process that has ended."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class PeakPss:
    """While its block runs, a thread samples the PSS of this process's tree every
    :data:`INTERVAL` seconds; :attr:`megabytes` is the largest sum seen (None off Linux)."""

    def __init__(self) -> None:
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="pss-sampler", daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak_kib = max(self.peak_kib, sum(pss_kib(pid) for pid in tree(os.getpid())))
            if self._stop.wait(INTERVAL):
                return

    @property
    def megabytes(self) -> float | None:
        return self.peak_kib / 1024 if self.peak_kib else None

    def __enter__(self) -> PeakPss:
        if os.path.exists(f"/proc/{os.getpid()}/smaps_rollup"):
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
