"""Batch arrays built directly in the shared memory they travel in.

Inside a WebLoader worker, :func:`install` makes :func:`wdsx.core.allocate.empty` hand out
arrays that live in one of the worker's recycled segments (:mod:`wdsx.loader.transport`).
A stage that builds a batch into such an array (``batched``'s collation, or images decoded
straight into the batch) writes it once: when the batch is sent, :func:`transport.pack`
recognises the array's memory and sends the segment as it is, instead of copying the batch
into a segment.

A segment handed out this way is reused only when both sides are done with it: the main
process has freed every tensor it received from it (the flag in the segment's header), and
no array over it is left in the worker (``pinned``). An array that is never sent frees its
segment when it is garbage-collected.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from wdsx.core import allocate
from wdsx.loader import transport
from wdsx.loader.transport import HEADER, MIN_BYTES, Claim, SegmentPool, _Segment


class _Allocation:
    """One array handed out in a segment, and whether it has been sent to the main process."""

    __slots__ = ("segment", "sent")

    def __init__(self, segment: _Segment):
        self.segment = segment
        self.sent = False


class SharedArena:
    """Allocates large batch arrays in ``pool``'s segments and finds them again when sent."""

    def __init__(self, pool: SegmentPool):
        self.pool = pool
        self.live: list[_Allocation] = []

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialised array of ``shape``: in a segment when it is large enough to gain."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype.itemsize
        if nbytes < MIN_BYTES:
            return np.empty(shape, dtype)
        segment = self.pool.take(nbytes)
        segment.pinned += 1
        allocation = _Allocation(segment)
        # Views of ``base`` keep it alive, so its end is the end of every use in this process.
        base = np.frombuffer(segment.map, dtype=np.uint8, count=nbytes, offset=HEADER)
        weakref.finalize(base, self._released, allocation)
        self.live.append(allocation)
        return base.view(dtype).reshape(shape)

    def _released(self, allocation: _Allocation) -> None:
        """The last array over an allocation is gone from this process."""
        segment = allocation.segment
        segment.pinned -= 1
        if not allocation.sent:
            segment.map[0] = 0
        self.live.remove(allocation)

    def claim(self, tensor: Any) -> tuple[_Segment, int] | None:
        """The segment and offset of a contiguous tensor that lies in an array from this arena
        not sent before, marking it sent; None for any other tensor (it is copied instead)."""
        if not tensor.is_contiguous():
            return None
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        for allocation in list(self.live):  # a collection may end one meanwhile
            segment = allocation.segment
            first = segment.address + HEADER
            if first <= start and end <= first + segment.size:
                if allocation.sent:
                    return None
                allocation.sent = True
                return segment, start - segment.address
        return None


_arenas: dict[int, SharedArena] = {}


def worker_arena() -> SharedArena:
    """This process's arena (and through it, its segment pool); one per process, so that a
    forked worker never shares its parent's."""
    pid = os.getpid()
    arena = _arenas.get(pid)
    if arena is None:
        _arenas.clear()
        arena = _arenas[pid] = SharedArena(SegmentPool())
    return arena


def worker_memory() -> tuple[SegmentPool, Claim]:
    """This process's segment pool and the claim of its arena, for packing batches."""
    arena = worker_arena()
    return arena.pool, arena.claim


def install() -> None:
    """Build this process's batch arrays in its arena."""
    allocate.install(worker_arena().empty)


class InitWorker:
    """A DataLoader ``worker_init_fn`` that installs the worker's arena, then runs the user's."""

    def __init__(self, user: Callable[[int], Any] | None):
        self.user = user

    def __call__(self, worker_id: int) -> None:
        if transport.AVAILABLE:
            install()
        if self.user is not None:
            self.user(worker_id)
