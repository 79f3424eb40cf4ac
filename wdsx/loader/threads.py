"""Reader threads: a WebLoader's workers as threads of the loader's process.

Each reader runs in its own daemon thread, batches and collates its items as a DataLoader
worker does (``batch_size``, ``drop_last``, the collate function) and puts the batches in a
bounded queue (``prefetch`` batches). :func:`round_robin` takes them in PyTorch's order for an
IterableDataset: one batch from each reader in turn, skipping the readers that have finished.

No thread outlives the iteration: when it ends, however it ends (exhausted, an error, the
generator closed or garbage-collected), the threads are told to stop, which they see between
items and while waiting to put a batch, and are joined. An exception in a reader is raised in
the consumer, with the reader's frames in its traceback.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
import time
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("wdsx")

CONTEXT = types.SimpleNamespace(SimpleQueue=queue.SimpleQueue, Event=threading.Event)
"""What a WebLoader's :class:`~wdsx.loader.profile.LoaderWatch` takes from a multiprocessing
context (the channel for stall reports, worker 0's head-start signal), for reader threads."""

POLL = 0.1
"""Seconds between looks at the stop signal while a reader waits for room in its queue, and
at a reader's liveness while the consumer waits for a batch."""

JOIN_TIMEOUT = 10.0
"""Seconds to wait, in all, for the readers to stop; a reader stuck in a call that never
returns (a hung read) is left behind, with a warning: it is a daemon thread."""


@dataclass(frozen=True)
class Batching:
    """How a reader turns items into batches, as a DataLoader worker does: lists of
    ``batch_size`` items collated (``batch_size=None``: every item converted on its own), a
    short last batch dropped with ``drop_last``."""

    batch_size: int | None
    drop_last: bool
    collate: Callable[[Any], Any]

    def batches(self, items: Iterator) -> Iterator:
        if self.batch_size is None:
            for item in items:
                yield self.collate(item)
            return
        while True:
            chunk = list(itertools.islice(items, self.batch_size))
            short = len(chunk) < self.batch_size
            if chunk and not (short and self.drop_last):
                yield self.collate(chunk)
            if short:
                return


class _Stopped(Exception):
    """The iteration ended while this reader was still reading."""


_BATCH, _END, _ERROR = "batch", "end", "error"


class Reader:
    """One reader thread: ``read()`` (called in the thread) gives its items, which it batches
    into a queue of at most ``prefetch`` batches."""

    def __init__(self, number: int, read: Callable[[], Iterator], batching: Batching, prefetch: int):
        self.number = number
        self.read = read
        self.batching = batching
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"wdsx-reader-{number}", daemon=True)

    def _run(self) -> None:
        items: Iterator | None = None
        try:
            items = self.read()
            for batch in self.batching.batches(self._until_stopped(items)):
                self._put((_BATCH, batch))
            self._put((_END, None))
        except _Stopped:
            pass
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, which raises it
            error.add_note(f"(in wdsx reader thread {self.number})")
            try:
                self._put((_ERROR, error))
            except _Stopped:
                pass
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # in this thread, which ran it: its stages release what they hold

    def _until_stopped(self, items: Iterator) -> Iterator:
        for item in items:
            if self.stop.is_set():
                raise _Stopped
            yield item

    def _put(self, message: tuple[str, Any]) -> None:
        while True:
            if self.stop.is_set():
                raise _Stopped
            try:
                self.queue.put(message, timeout=POLL)
                return
            except queue.Full:
                continue

    def take(self, timeout: float) -> tuple[str, Any]:
        """The reader's next message; ``timeout`` > 0: at most that many seconds' wait."""
        began = time.monotonic()
        while True:
            try:
                return self.queue.get(timeout=POLL)
            except queue.Empty:
                pass
            if not self.thread.is_alive() and self.queue.empty():
                raise RuntimeError(f"wdsx reader thread {self.number} ended without finishing")
            if timeout > 0 and time.monotonic() - began > timeout:
                raise RuntimeError(f"wdsx reader thread {self.number} timed out after {timeout} seconds")


def round_robin(
    reads: Sequence[Callable[[], Iterator]], batching: Batching, prefetch: int, timeout: float = 0.0
) -> Iterator:
    """The batches of one reader thread per ``reads`` entry, in turn (skipping finished
    readers), as a DataLoader's worker processes deliver them; the threads are stopped and
    joined when this generator ends."""
    readers = [Reader(number, read, batching, prefetch) for number, read in enumerate(reads)]
    for reader in readers:
        reader.thread.start()
    try:
        active = list(readers)
        while active:
            for reader in list(active):
                kind, value = reader.take(timeout)
                if kind == _END:
                    active.remove(reader)
                elif kind == _ERROR:
                    raise value
                else:
                    yield value
    finally:
        stop(readers)


def stop(readers: Sequence[Reader]) -> None:
    """Tell every reader to stop and wait (bounded) until they have."""
    for reader in readers:
        reader.stop.set()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for reader in readers:
        # the garbage collector may end the iteration in one of the readers themselves
        if reader.thread is not threading.current_thread():
            reader.thread.join(max(0.0, deadline - time.monotonic()))
    current = threading.current_thread()
    stuck = [reader.number for reader in readers if reader.thread.is_alive() and reader.thread is not current]
    if stuck:
        log.warning("wdsx reader threads %s did not stop within %.0f s", stuck, JOIN_TIMEOUT)


def worker_batches(
    stream: Callable[[int], Iterator], workers: int, loader_kwargs: dict[str, Any], collate: Callable
) -> Iterator:
    """A DataLoader's batches with ``workers`` reader threads as its workers: thread ``i``
    runs the DataLoader's ``worker_init_fn(i)``, then batches ``stream(i)`` as the
    DataLoader's arguments say (``batch_size``, ``drop_last``, ``prefetch_factor``,
    ``timeout``, ``pin_memory`` where a GPU is present) with ``collate``, whose result's first
    element is the batch."""
    if loader_kwargs.get("pin_memory") and _gpu_present():
        collate = _Pinned(collate, loader_kwargs.get("pin_memory_device") or None)
    batch_size, drop_last = loader_kwargs.get("batch_size", 1), loader_kwargs.get("drop_last", False)
    init = loader_kwargs.get("worker_init_fn")
    reads = [functools.partial(_initialised, stream, worker, init) for worker in range(workers)]
    prefetch = loader_kwargs.get("prefetch_factor") or 2
    return round_robin(
        reads, Batching(batch_size, drop_last, collate), prefetch, loader_kwargs.get("timeout", 0)
    )


def _initialised(
    stream: Callable[[int], Iterator], worker: int, init: Callable[[int], None] | None
) -> Iterator:
    """In reader thread ``worker``: ``init(worker)``, then the worker's items."""
    if init is not None:
        init(worker)
    return stream(worker)


def _gpu_present() -> bool:
    import torch

    return torch.cuda.is_available()


class _Pinned:
    """Collates as ``collate`` does, with the batch (the first element of its result, not the
    state beside it) copied to pinned memory, as a DataLoader's ``pin_memory=True`` does."""

    def __init__(self, collate: Callable, device: str | None):
        self.collate = collate
        self.device = device

    def __call__(self, batch: Any) -> tuple:
        from torch.utils.data._utils.pin_memory import pin_memory

        output, *rest = self.collate(batch)
        return (pin_memory(output, self.device), *rest)
