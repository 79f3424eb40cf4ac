"""Where batch arrays are allocated.

A stage that builds a batch (``batched``'s collation, decoding straight into a batch) asks
:func:`empty` for its output array. Inside a WebLoader worker process the loader installs an
allocator that places large arrays in the shared memory the batch will travel to the main
process in, so the batch is written once and never copied for the trip
(:mod:`wdsx.loader.arena`).

Everywhere else (the main process, thread workers) a large batch array lives in memory of its
own that is recycled (:class:`Recycler`): when the last array or tensor over it is freed, the
memory waits for the next batch of the same size instead of going back to ``malloc``. A
pipeline makes batches of a few sizes at most, so after the first batches each new one is
written into memory already mapped, with no page faults; and the memory held is the batches
alive plus a few spare ones, not what ``malloc``'s per-thread arenas keep after batches built
in reader threads are freed in another thread (tens of MB on a 2-thread image loader).
"""

from __future__ import annotations

import collections
import functools
import math
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

Allocator = Callable[[tuple[int, ...], Any], np.ndarray]

RECYCLED_BYTES = 1 << 20
"""Arrays at least this large are recycled; smaller ones come from ``numpy.empty``."""

SPARE = 2
"""Freed batch memories kept for reuse, at most; older spare ones are unmapped."""


class Recycler:
    """Large arrays over anonymous memory maps, each map reused once every array over it is
    gone. Safe to use from several threads."""

    def __init__(self, spare: int = SPARE):
        self.spare = spare
        self.free: collections.deque[mmap.mmap] = collections.deque()
        self.lock = threading.RLock()  # re-entered if a collection frees an array meanwhile
        if hasattr(os, "register_at_fork"):  # a fork while another thread held the lock
            os.register_at_fork(after_in_child=functools.partial(_new_lock, weakref.ref(self)))

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize  # (``np.prod`` costs more than a small batch)
        if nbytes < RECYCLED_BYTES or dtype.hasobject:
            return np.empty(shape, dtype)
        memory = self._take(nbytes) or _private_memory(nbytes)
        # Every view of ``base`` (the array returned, its slices, a tensor from it) keeps it
        # alive, so its end is the end of every use of the memory.
        base = np.frombuffer(memory, dtype=np.uint8, count=nbytes)
        weakref.finalize(base, self._give_back, memory).atexit = False
        return base.view(dtype).reshape(shape)

    def _take(self, nbytes: int) -> mmap.mmap | None:
        with self.lock:
            for index in range(len(self.free) - 1, -1, -1):
                if len(self.free[index]) == nbytes:
                    memory = self.free[index]
                    del self.free[index]
                    return memory
        return None

    def _give_back(self, memory: mmap.mmap) -> None:
        with self.lock:
            self.free.append(memory)
            while len(self.free) > self.spare:
                self.free.popleft()  # unmapped once nothing uses it


def _new_lock(recycler: weakref.ref[Recycler]) -> None:
    """In a forked child: a fresh lock for the recycler, if it still exists (the parent's may
    have been held by a thread the child does not have, and would stay held for good)."""
    alive = recycler()
    if alive is not None:
        alive.lock = threading.RLock()


def _private_memory(nbytes: int) -> mmap.mmap:
    """``nbytes`` of zeroed memory of this process's own: copied on write in a forked child, as
    ``malloc``'s is (``mmap``'s default for anonymous memory shares it with children instead)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return mmap.mmap(-1, nbytes)  # Windows: anonymous memory is the process's own


_recycler = Recycler()
_installed: list[Allocator] = []


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array for a batch, from the installed allocator if there is one."""
    if _installed:
        return _installed[0](shape, dtype)
    return _recycler.empty(shape, dtype)


def maker(shape: tuple[int, ...], dtype: Any) -> Callable[[], np.ndarray]:
    """A function that returns a new uninitialised array of ``shape`` and ``dtype`` each time it
    is called, as :func:`empty` would, with the choice of allocator made once: a reader that
    builds many batches of one shape (rows of ``.npy`` shards) saves that choice per batch."""
    if _installed:
        return functools.partial(_installed[0], shape, dtype)
    dtype = np.dtype(dtype)
    if math.prod(shape) * dtype.itemsize < RECYCLED_BYTES or dtype.hasobject:
        return functools.partial(np.empty, shape, dtype)
    return functools.partial(_recycler.empty, shape, dtype)


def shared() -> bool:
    """True when a worker's shared-memory allocator is installed (batches built with
    :func:`empty` then skip a copy on their way out of the process)."""
    return bool(_installed)


def install(allocator: Allocator | None) -> None:
    """Make ``allocator`` this process's batch allocator (None: back to recycled memory)."""
    _installed[:] = [] if allocator is None else [allocator]
