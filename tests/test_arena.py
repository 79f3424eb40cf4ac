"""Batches built in shared memory (:mod:`wdsx.loader.arena`): they arrive equal, travel without
a copy, and their segment is reused only when neither side holds them any more."""

from __future__ import annotations

import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from wdsx.loader import arena, transport

pytestmark = pytest.mark.skipif(not transport.AVAILABLE, reason="needs memfd_create")


def send(value, memory: arena.SharedArena):
    """What the main process receives when a worker sends ``value``."""
    return pickle.loads(ForkingPickler.dumps(transport.pack(value, memory.pool, memory.claim)))


def test_an_array_built_in_the_arena_travels_in_its_own_segment():
    memory = arena.SharedArena(transport.SegmentPool())
    images = memory.empty((8, 64, 64, 3), np.uint8)
    images[...] = np.arange(images.size, dtype=np.int64).reshape(images.shape) % 253
    expected = images.copy()
    labels = torch.arange(8)
    packed = transport.pack((torch.from_numpy(images), labels), memory.pool, memory.claim)
    assert len(packed.segments) == 1 and packed.segments[0] is memory.live[0].segment  # not copied
    received = pickle.loads(ForkingPickler.dumps(packed))
    assert np.array_equal(received[0].numpy(), expected)
    assert torch.equal(received[1], labels)  # small: sent by value


def test_a_segment_is_reused_only_when_both_sides_are_done():
    memory = arena.SharedArena(transport.SegmentPool())
    images = memory.empty((8, 64, 64, 3), np.uint8)
    images[...] = 7
    segment = memory.live[0].segment
    received = send(torch.from_numpy(images), memory)
    del images
    gc.collect()
    assert segment.held  # the main process still has the batch
    row = received[2]
    del received
    gc.collect()
    assert segment.held  # a row of it, too
    del row
    gc.collect()
    assert not segment.held
    again = memory.empty((8, 64, 64, 3), np.uint8)
    assert memory.live[0].segment is segment
    del again


def test_an_array_the_worker_keeps_is_never_overwritten():
    memory = arena.SharedArena(transport.SegmentPool())
    images = memory.empty((8, 64, 64, 3), np.uint8)
    images[...] = 1
    kept = images[1]  # a view the worker still holds after sending
    received = send(torch.from_numpy(images), memory)
    del images, received
    gc.collect()
    other = memory.empty((8, 64, 64, 3), np.uint8)
    other[...] = 2
    assert (kept == 1).all()


def test_an_array_that_is_never_sent_frees_its_segment():
    memory = arena.SharedArena(transport.SegmentPool())
    images = memory.empty((8, 64, 64, 3), np.uint8)
    segment = memory.live[0].segment
    del images
    gc.collect()
    assert not segment.held and not memory.live


def test_an_array_sent_twice_is_copied_the_second_time():
    memory = arena.SharedArena(transport.SegmentPool())
    images = memory.empty((8, 64, 64, 3), np.uint8)
    images[...] = 3
    first = send(torch.from_numpy(images), memory)
    second = send(torch.from_numpy(images), memory)
    assert torch.equal(first, second)
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()


def test_small_arrays_are_plain_memory():
    memory = arena.SharedArena(transport.SegmentPool())
    small = memory.empty((4, 4), np.float32)
    assert not memory.live and small.shape == (4, 4)


def test_within_a_session_a_segment_travels_once_and_is_forgotten_when_dropped():
    pool = transport.SegmentPool()
    batch = torch.ones(64, 1024)
    first = bytes(ForkingPickler.dumps(transport.pack(batch, pool, session="s")))
    assert b"resource_sharer" in first
    assert torch.equal(pickle.loads(first), batch)  # freed at once: the segment is free again
    gc.collect()
    second = bytes(ForkingPickler.dumps(transport.pack(batch, pool, session="s")))
    assert b"resource_sharer" not in second  # named by its token this time
    received = pickle.loads(second)
    assert torch.equal(received, batch) and len(pool.segments) == 1
    token = pool.segments[0].token
    assert token in transport._sessions["s"]
    del received
    gc.collect()
    bigger = torch.ones(64, 4096)  # the segment no longer fits: the pool lets it go
    third = pickle.loads(ForkingPickler.dumps(transport.pack(bigger, pool, session="s")))
    assert torch.equal(third, bigger) and token not in transport._sessions["s"]
    transport.close_session("s")
    assert "s" not in transport._sessions
