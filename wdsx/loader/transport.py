"""Moving batches from DataLoader workers to the main process through recycled shared memory.

PyTorch sends every tensor a worker yields through a *new* shared-memory segment: the worker
copies the tensor into freshly allocated pages, and the first touch of a fresh shared page
costs several microseconds (allocation, zeroing, accounting). For a batch of 64 RGB images of
256x256 that is about 9 ms, as long as decoding a quarter of the batch.

Here each worker keeps a few segments (anonymous ``memfd`` files) and copies a batch's tensors
into one whose pages are already in place. The main process maps the segment and builds
ordinary tensors over it; when the last of them is freed, a flag in the segment's header tells
the worker that it may reuse the segment. Users receive the same tensors as before and may
keep, modify or send them anywhere: a segment still referenced is simply not reused. Segments
have no name, so nothing is left behind when a process dies.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
import weakref
from collections.abc import Callable
from multiprocessing.reduction import DupFd
from typing import Any

HEADER = 64  # bytes before the data: byte 0 is the in-use flag; keeps the data aligned
MIN_BYTES = 1 << 16  # below this a batch gains nothing and goes the usual way
POOL_SIZE = 8  # segments a worker keeps; batches beyond that get a segment of their own
AVAILABLE = hasattr(os, "memfd_create")


class _Segment:
    """One shared-memory file as the worker sees it; closed when the worker drops it."""

    def __init__(self, size: int):
        self.size = size
        self.fd = os.memfd_create("wdsx-batch", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, HEADER + size)
        self.map = mmap.mmap(self.fd, HEADER + size)
        start = ctypes.c_char.from_buffer(self.map)
        self.address = ctypes.addressof(start)
        """Where the segment is mapped in this process (to recognise arrays built in it)."""
        del start
        self.pinned = 0
        """Arrays over this segment still alive in the worker (:mod:`wdsx.loader.arena`)."""
        self.token = os.urandom(8)
        """Names the segment to a main process that keeps it mapped (see :class:`SharedBatch`)."""
        self.kept = False
        """Whether a pool keeps it for reuse (only those are kept mapped by the main process)."""
        self.announced = False
        """Whether its file descriptor has been sent to the main process."""
        weakref.finalize(self, _close, self.fd, self.map)

    @property
    def held(self) -> bool:
        """Whether the main process still uses the batch last sent in this segment, or the
        worker an array built in it."""
        return self.map[0] != 0 or self.pinned > 0

    def fits(self, size: int) -> bool:
        return size <= self.size <= 2 * size


def _close(fd: int, segment_map: mmap.mmap) -> None:
    try:
        segment_map.close()
    except BufferError:  # an array over it is being freed right now; unmapped when it is gone
        pass
    os.close(fd)


class SegmentPool:
    """A worker's segments: a free one that fits is reused, one that does not fit is dropped,
    and a new one is made when none is free."""

    def __init__(self, capacity: int = POOL_SIZE):
        self.capacity = capacity
        self.segments: list[_Segment] = []
        self.dropped: list[bytes] = []
        """Tokens of segments the main process keeps mapped that this pool has let go."""

    def take(self, size: int) -> _Segment:
        chosen = None
        for segment in list(self.segments):
            if segment.held:
                continue
            if chosen is None and segment.fits(size):
                chosen = segment
            elif not segment.fits(size):
                self.segments.remove(segment)
                if segment.announced:
                    self.dropped.append(segment.token)
        if chosen is None:
            chosen = _Segment(size)
            if len(self.segments) < self.capacity:
                chosen.kept = True
                self.segments.append(chosen)
        chosen.map[0] = 1
        return chosen

    def forgotten(self) -> list[bytes]:
        """The tokens of :attr:`dropped`, emptied, to send with the next batch."""
        dropped, self.dropped = self.dropped, []
        return dropped


Place = tuple[int, int, tuple[int, ...], Any, bytes | None]
"""Where one tensor of a batch travels: (segment number, offset, shape, dtype, None), or
(-1, 0, shape, dtype, its bytes) for a small tensor sent by value."""


class SharedBatch:
    """A batch whose tensors are in segments: copied into one, or built in one from the start
    (:mod:`wdsx.loader.arena`). It pickles as the segments plus the tensors' places, and
    unpickles as the original structure of tensors.

    Passing a file descriptor to another process takes a round trip through a socket (and a
    thread of the worker). Within a ``session`` (one DataLoader pass) the main process keeps
    the segments a worker's pool keeps mapped, so a segment's descriptor travels once, with
    the first batch in it; later batches name it by its token, and the main process finds its
    pages already mapped. The worker says when its pool lets a segment go; the session ends
    with the pass (:func:`close_session`)."""

    def __init__(
        self,
        structure: Any,
        layout: list[Place],
        segments: list[_Segment],
        session: str | None = None,
        forgotten: list[bytes] | None = None,
    ):
        self.structure = structure
        self.layout = layout
        self.segments = segments
        self.session = session
        self.forgotten = forgotten or []

    def __reduce__(self) -> tuple:
        parts: list[tuple[bytes | None, Any, int]] = []
        for segment in self.segments:
            keep = self.session is not None and segment.kept
            total = HEADER + segment.size
            if keep and segment.announced:
                parts.append((segment.token, None, total))
                continue
            parts.append((segment.token if keep else None, DupFd(segment.fd), total))
            segment.announced = keep
        return _receive, (self.structure, self.layout, parts, self.session, self.forgotten)


class _Slot:
    """Stands for the n-th tensor of a batch inside its structure."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __reduce__(self) -> tuple:
        return _Slot, (self.index,)


def _rebuild(value: Any, leaf: Any) -> Any:
    """``value`` with each leaf replaced by ``leaf(value)`` (which returns it unchanged, or not),
    through the containers collation makes: tuples, lists and dicts."""
    replaced = leaf(value)
    if replaced is not value:
        return replaced
    if type(value) is tuple:
        return tuple(_rebuild(v, leaf) for v in value)
    if type(value) is list:
        return [_rebuild(v, leaf) for v in value]
    if type(value) is dict:
        return {k: _rebuild(v, leaf) for k, v in value.items()}
    return value


def _nbytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size()


def _aligned(n: int) -> int:
    return -(-n // HEADER) * HEADER


Claim = Callable[[Any], "tuple[_Segment, int] | None"]
"""Finds the segment (and offset) a tensor was built in, if it was (an arena's ``claim``)."""


def pack(batch: Any, pool: SegmentPool, claim: Claim | None = None, session: str | None = None) -> Any:
    """The batch ready to send to the main process: tensors built in a segment (``claim``
    finds them) travel in it as they are, the other plain CPU tensors are copied into one
    recycled segment (or, when they are small and others travel in segments, sent by value),
    and a batch that holds too little to gain goes unchanged. ``session``: see
    :class:`SharedBatch`."""
    import torch

    tensors: list = []

    def take_tensor(value: Any) -> Any:
        if type(value) is not torch.Tensor or value.device.type != "cpu" or value.requires_grad:
            return value
        if value.is_sparse or value.is_quantized or not value.is_contiguous():
            return value  # PyTorch's own way keeps its strides (a channels-last batch stays one)
        tensors.append(value)
        return _Slot(len(tensors) - 1)

    structure = _rebuild(batch, take_tensor)
    built = [None if claim is None else claim(tensor) for tensor in tensors]
    loose = sum(_aligned(_nbytes(tensor)) for tensor, place in zip(tensors, built) if place is None)
    if loose < MIN_BYTES and not any(built):
        return batch
    segments: list[_Segment] = []
    layout: list[Place] = []
    copied = pool.take(loose) if loose >= MIN_BYTES else None
    offset = HEADER
    for tensor, place in zip(tensors, built):
        shape = tuple(tensor.shape)
        if place is None and copied is None:
            layout.append((-1, 0, shape, tensor.dtype, _tensor_bytes(tensor)))
            continue
        if place is None:
            assert copied is not None
            target = torch.frombuffer(copied.map, dtype=tensor.dtype, count=tensor.numel(), offset=offset)
            target.view(tensor.shape).copy_(tensor)
            place = (copied, offset)
            offset += _aligned(_nbytes(tensor))
        segment, at = place
        if segment not in segments:
            segments.append(segment)
        layout.append((segments.index(segment), at, shape, tensor.dtype, None))
    return SharedBatch(structure, layout, segments, session, pool.forgotten() if session else None)


def _tensor_bytes(tensor: Any) -> bytes:
    """A small tensor's contents, to send by value."""
    import torch

    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _from_bytes(data: bytes, shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape)


class _Lease:
    """The main process's use of one segment, which ends when its last tensor is freed."""

    def __init__(self, segment_map: mmap.mmap, count: int):
        self.map = segment_map
        self.count = count

    def release_one(self) -> None:
        self.count -= 1
        if self.count == 0:
            self.map[0] = 0


_sessions: dict[str, dict[bytes, mmap.mmap]] = {}
"""In the main process: per session, the segments kept mapped, by token."""


def close_session(session: str) -> None:
    """Forget the segments of a session (its tensors still in use keep their pages)."""
    _sessions.pop(session, None)


def _receive(structure: Any, layout: list[Place], parts: list, session: str | None, forgotten: list) -> Any:
    """Unpickling a SharedBatch: map its segments (or find them mapped) and rebuild the batch
    over them."""
    import torch

    kept = _sessions.setdefault(session, {}) if session is not None else {}
    for token in forgotten:
        kept.pop(token, None)
    maps = []
    for token, descriptor, total in parts:
        if descriptor is None:
            if token not in kept:
                raise RuntimeError("a batch names a shared-memory segment this process was never sent")
            maps.append(kept[token])
            continue
        fd = descriptor.detach()
        try:
            segment_map = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        if token is not None:
            kept[token] = segment_map
        maps.append(segment_map)
    leases = [_Lease(segment_map, 0) for segment_map in maps]
    for number, *_ in layout:
        if number >= 0:
            leases[number].count += 1
    tensors = []
    for number, offset, shape, dtype, data in layout:
        if number < 0:
            assert data is not None
            tensors.append(_from_bytes(data, shape, dtype))
            continue
        count = 1
        for n in shape:
            count *= n
        # torch keeps this view until the tensor's storage is freed: its end is the release.
        view = memoryview(maps[number])
        weakref.finalize(view, leases[number].release_one)
        tensors.append(torch.frombuffer(view, dtype=dtype, count=count, offset=offset).view(shape))
    return _rebuild(structure, lambda value: tensors[value.index] if isinstance(value, _Slot) else value)


class PackingCollate:
    """A DataLoader ``collate_fn`` that collates as given, then, inside a worker process,
    packs the batch for the trip to the main process."""

    def __init__(
        self,
        collate: Any,
        memory: Callable[[], tuple[SegmentPool, Claim]] | None = None,
        session: str | None = None,
    ):
        self.collate = collate
        self.session = session
        """The DataLoader pass whose main process keeps segments mapped (:class:`SharedBatch`)."""
        self.memory = memory
        """Gives the worker's segment pool and the claim of its arena (:mod:`wdsx.loader.arena`),
        when batches may be built in shared memory; else the collate keeps a pool of its own."""
        self.pool: SegmentPool | None = None
        self.seconds = 0.0
        """Time spent packing batches, for the loader's statistics."""

    def __call__(self, batch: Any) -> Any:
        output = self.collate(batch)
        began = time.perf_counter()
        packed = self.send(output)
        self.seconds += time.perf_counter() - began
        return packed

    def send(self, output: Any) -> Any:
        from torch.utils.data import get_worker_info

        if not AVAILABLE or get_worker_info() is None:
            return output
        if self.memory is not None:
            pool, claim = self.memory()
            return pack(output, pool, claim, self.session)
        if self.pool is None:
            self.pool = SegmentPool()
        return pack(output, self.pool)
