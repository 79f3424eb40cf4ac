"""Fuzz campaigns: inputs ``[start, start + count)`` of a seed over one or more surfaces (input
``i`` belongs to surface ``i % len(surfaces)``), read in worker processes, each input under a
watchdog and every worker under a memory cap, summarised by outcome class.

A worker takes chunks of input indices from a queue and reports each chunk's tally. Before
each input it sets an interval timer (``timeout``): a reading still running when it fires is
interrupted and counted as a hang. Should an input hang where the timer cannot interrupt it
(inside a C call), the parent sees the worker's current input stop changing, kills the worker
and counts a hang; a worker that dies (a crash, the kernel's OOM killer) counts a crash. Either
way the rest of its chunk is handed to a fresh worker, so every input is run exactly once.

The memory cap is an address-space limit (``RLIMIT_AS``) of the worker's size when ready plus
``memory_mb``: an allocation beyond it raises ``MemoryError``, counted as over-memory. Workers
read with wdsx's memory limits lowered (:data:`LIMITS`), so that inputs of a few KB reach them.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import queue
import resource
import signal
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.fuzz import surfaces as surface_kinds
from tests.fuzz.outcomes import FAILURES, OUTCOMES, Hang

CHUNK = 250
_M_ARENA_MAX = -8
"""glibc's ``mallopt`` parameter for the most malloc arenas."""
EXAMPLES = 20
LIMITS = {
    "WDSX_MAX_LINE_BYTES": str(4 << 10),
    "WDSX_INFLATE_GRACE_BYTES": str(256 << 10),
    "WDSX_MAX_INFLATE_RATIO": "100",
    "WDSX_MAX_MEMBER_BYTES": str(16 << 20),
    "WDSX_STALL_TIMEOUT": "0.2",
}
"""wdsx's limits in fuzz workers (the oracles read the same variables)."""


@dataclass
class Summary:
    """The tally of a campaign."""

    seed: int
    surfaces: tuple[str, ...] = ("tar",)
    inputs: int = 0
    outcomes: Counter = field(default_factory=Counter)
    by_surface: dict[str, Counter] = field(default_factory=dict)
    by_mutation: dict[str, Counter] = field(default_factory=dict)
    """Outcomes per ``surface:mutation`` (an input with several mutations counts under each)."""
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)
    """``(index, class, input description, detail)`` of the first failing inputs."""
    seconds: float = 0.0

    @property
    def failed(self) -> int:
        return sum(self.outcomes[name] for name in FAILURES)

    def add(self, other: dict[str, Any]) -> None:
        self.inputs += other["inputs"]
        self.outcomes.update(other["outcomes"])
        for table, counted in (
            (self.by_surface, other["by_surface"]),
            (self.by_mutation, other["by_mutation"]),
        ):
            for name, counts in counted.items():
                table.setdefault(name, Counter()).update(counts)
        room = EXAMPLES - len(self.failures)
        self.failures += other["failures"][: max(0, room)]

    def table(self) -> str:
        """The summary as text: outcome classes, failures, and outcomes per mutation."""
        rate = self.inputs / self.seconds if self.seconds else 0.0
        lines = [
            f"fuzz campaign, seed {self.seed}, surfaces {','.join(self.surfaces)}: {self.inputs} inputs "
            f"in {self.seconds:.1f} s ({rate:.0f} inputs/s)",
            "",
            f"{'outcome':<14}{'inputs':>10}  {'share':>7}  failure?",
        ]
        for name in OUTCOMES:
            count = self.outcomes.get(name, 0)
            share = 100 * count / self.inputs if self.inputs else 0.0
            lines.append(f"{name:<14}{count:>10}  {share:6.2f}%  {'FAIL' if name in FAILURES else ''}")
        lines.append(f"{'failures':<14}{self.failed:>10}")
        if self.failures:
            lines += ["", "first failures (index, class, input, detail):"]
            lines += [f"  {index} {kind} {what}: {detail}" for index, kind, what, detail in self.failures]
        lines += _breakdown("surface", self.by_surface) + _breakdown("surface:mutation", self.by_mutation)
        return "\n".join(lines)


def _breakdown(title: str, counts: dict[str, Counter]) -> list[str]:
    """Lines of a table of outcome counts (the four passing classes, and failures) per row."""
    lines = ["", f"{title:<34}" + "".join(f"{name:>10}" for name in OUTCOMES[:4]) + f"{'failures':>10}"]
    for name in sorted(counts):
        row = counts[name]
        failed = sum(row[kind] for kind in FAILURES)
        lines.append(f"{name:<34}" + "".join(f"{row[kind]:>10}" for kind in OUTCOMES[:4]) + f"{failed:>10}")
    return lines


def _describe(surface: str, item: Any) -> str:
    return f"{surface}:{item.what}+{','.join(item.mutations)}"


class _Tally:
    """A worker's counts for one chunk."""

    def __init__(self) -> None:
        self.report: dict[str, Any] = {
            "inputs": 0,
            "outcomes": Counter(),
            "by_surface": {},
            "by_mutation": {},
            "failures": [],
        }

    def add(self, index: int, surface: str, item: Any, kind: str, detail: str) -> None:
        """Count input ``index`` of ``surface`` (``item``: None when it was lost with its worker)."""
        self.report["inputs"] += 1
        self.report["outcomes"][kind] += 1
        self.report["by_surface"].setdefault(surface, Counter())[kind] += 1
        for name in item.mutations if item is not None else ("?",):
            self.report["by_mutation"].setdefault(f"{surface}:{name}", Counter())[kind] += 1
        if kind in FAILURES and len(self.report["failures"]) < EXAMPLES:
            what = _describe(surface, item) if item is not None else f"{surface}:?"
            self.report["failures"].append((index, kind, what, detail))


def _on_alarm(signum: int, frame: Any) -> None:
    raise Hang()


def surface_of(index: int, surfaces: list[Any]) -> Any:
    """The surface input ``index`` belongs to."""
    return surfaces[index % len(surfaces)]


def run_one(surface: Any, seed: int, index: int, scratch: str, timeout: float) -> tuple[Any, str, str]:
    """Build, read and classify input ``index`` of ``surface`` (the reading under the alarm
    when ``timeout`` > 0)."""
    item = surface.make(seed, index)
    if timeout > 0:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        readings = surface.read(item, scratch)
    except Hang:
        return item, "hang", "the reading did not finish within the watchdog's time"
    finally:
        if timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, 0)
    kind, detail = surface.classify(item, readings)
    return item, kind, detail


def prepare(names: tuple[str, ...], seed: int, scratch: str) -> list[Any]:
    """The surfaces ``names``, built for ``seed`` with the fuzz limits set."""
    os.environ.update(LIMITS)
    logging.getLogger("wdsx").setLevel(logging.ERROR)  # retries and skips are expected here
    warnings.simplefilter("ignore")  # numpy's notes on odd headers, Pillow's on odd images
    return [surface_kinds.build(name, seed, scratch) for name in names]


def _one_malloc_arena() -> None:
    """Make glibc's malloc serve every thread from one arena. Otherwise each thread that
    allocates may get an arena of its own, reserving 64 MB of address space: the HTTP
    surface's server threads then grow the address space the memory cap measures by hundreds
    of MB while resident memory hardly moves (measured: +367 MB of address space, +18 MB
    resident, over 4,000 HTTP inputs; +44 MB with one arena)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator is not the one measured here


def _limit_memory(megabytes: int) -> None:
    with open("/proc/self/statm") as statm:
        size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = size + megabytes * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))


def _worker(
    seed: int,
    names: tuple[str, ...],
    timeout: float,
    memory_mb: int,
    chunks: Any,
    results: Any,
    current: Any,
    slot: int,
) -> None:
    os.nice(5)
    _one_malloc_arena()
    signal.signal(signal.SIGALRM, _on_alarm)
    with tempfile.TemporaryDirectory(
        prefix="wdsx-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    ) as scratch:
        surfaces = prepare(names, seed, scratch)
        if memory_mb:
            _limit_memory(memory_mb)
        while True:
            chunk = chunks.get()
            if chunk is None:
                return
            low, high = chunk
            tally = _Tally()
            for index in range(low, high):
                current[3 * slot : 3 * slot + 3] = [index, low, high]
                surface = surface_of(index, surfaces)
                try:
                    item, kind, detail = run_one(surface, seed, index, scratch, timeout)
                except MemoryError:
                    item, kind, detail = None, "over-memory", "MemoryError outside the readings"
                tally.add(index, surface.name, item, kind, detail)
            current[3 * slot] = -1
            results.put(tally.report)


def run_campaign(
    seed: int,
    count: int,
    *,
    surfaces: tuple[str, ...] = ("tar",),
    start: int = 0,
    workers: int = 1,
    timeout: float = 5.0,
    memory_mb: int = 512,
    progress: Any = None,
) -> Summary:
    """Run inputs ``[start, start + count)`` of ``seed`` over ``surfaces`` in ``workers`` processes.

    ``progress(summary)``, when given, is called after every chunk."""
    context = multiprocessing.get_context("fork")
    chunks: Any = context.Queue()
    results: Any = context.Queue()
    pending = 0
    for low in range(start, start + count, CHUNK):
        chunks.put((low, min(low + CHUNK, start + count)))
        pending += 1
    current = context.Array("q", [-1] * (3 * workers), lock=False)
    """Per worker: the input it is reading (-1: none) and its chunk's bounds."""
    summary = Summary(seed, surfaces)
    started = time.perf_counter()

    def spawn(slot: int) -> Any:
        process = context.Process(
            target=_worker,
            args=(seed, surfaces, timeout, memory_mb, chunks, results, current, slot),
            daemon=True,
        )
        process.start()
        return process

    processes = [spawn(slot) for slot in range(workers)]
    watched = [(-1, time.monotonic())] * workers
    stalled_after = max(30.0, 6 * timeout)
    try:
        while pending:
            try:
                summary.add(results.get(timeout=1.0))
                pending -= 1
                summary.seconds = time.perf_counter() - started
                if progress is not None:
                    progress(summary)
                continue
            except queue.Empty:
                pass
            for slot, process in enumerate(processes):
                index, low, high = current[3 * slot : 3 * slot + 3]
                if index != watched[slot][0]:
                    watched[slot] = (index, time.monotonic())
                stalled = index >= 0 and time.monotonic() - watched[slot][1] > stalled_after
                if process.is_alive() and not stalled:
                    continue
                if index < 0:
                    raise RuntimeError(
                        f"fuzz worker {slot} died outside an input (exit code {process.exitcode})"
                    )
                kind = "hang" if process.is_alive() else "crash"
                process.kill()
                process.join()
                lost = surfaces[index % len(surfaces)]
                pending += _split_chunk(chunks, summary, seed, lost, (low, index, high), kind) - 1
                processes[slot] = spawn(slot)
                watched[slot] = (-1, time.monotonic())
    finally:
        for _ in processes:
            chunks.put(None)
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    summary.seconds = time.perf_counter() - started
    return summary


def _split_chunk(
    chunks: Any, summary: Summary, seed: int, surface: str, lost: tuple[int, int, int], kind: str
) -> int:
    """A worker was lost at input ``index`` of its chunk ``[low, high)`` (``lost``), of
    ``surface``: count that input as ``kind`` and queue the chunk's other inputs again; returns
    the chunks queued."""
    low, index, high = lost
    tally = _Tally()
    tally.add(index, surface, None, kind, f"worker lost at input {index} of seed {seed}")
    summary.add(tally.report)
    queued = 0
    for part in ((low, index), (index + 1, high)):
        if part[0] < part[1]:
            chunks.put(part)
            queued += 1
    return queued
