"""Recycled batch memory (wdsx.core.allocate): a batch's memory is reused only once nothing
uses it any more, whatever holds it (a slice, a tensor, another thread)."""

from __future__ import annotations

import gc
import os
import signal
import threading
import time

import numpy as np
import pytest

from wdsx.core import allocate
from wdsx.core.allocate import RECYCLED_BYTES, Recycler

SHAPE = (16, 128, 128, 3)  # 3 MiB as float32: over the size that is recycled
assert np.prod(SHAPE) * 4 >= RECYCLED_BYTES


def filled(recycler: Recycler, value: float) -> np.ndarray:
    array = recycler.empty(SHAPE, np.float32)
    array[...] = value
    return array


def test_memory_is_reused_once_the_batch_is_gone() -> None:
    recycler = Recycler(spare=2)
    first = filled(recycler, 1)
    address = first.__array_interface__["data"][0]
    del first
    gc.collect()
    assert len(recycler.free) == 1
    second = recycler.empty(SHAPE, np.float32)
    assert second.__array_interface__["data"][0] == address
    assert not recycler.free


@pytest.mark.parametrize("keep", ["slice", "tensor", "reshaped"])
def test_memory_still_used_is_never_handed_out_again(keep: str) -> None:
    recycler = Recycler(spare=2)
    batch = filled(recycler, 1)
    if keep == "slice":
        kept = batch[3:5]
    elif keep == "tensor":
        torch = pytest.importorskip("torch")
        kept = torch.from_numpy(batch)
    else:
        kept = batch.reshape(-1)
    del batch
    gc.collect()
    assert not recycler.free
    others = [filled(recycler, 2) for _ in range(3)]
    assert float(kept.min()) == float(kept.max()) == 1.0  # untouched by the batches after it
    del others


def test_no_more_than_the_spare_count_is_kept() -> None:
    recycler = Recycler(spare=2)
    batches = [filled(recycler, n) for n in range(5)]
    del batches
    gc.collect()
    assert len(recycler.free) == 2


def test_sizes_are_not_mixed_up() -> None:
    recycler = Recycler(spare=4)
    small = recycler.empty((RECYCLED_BYTES,), np.uint8)
    del small
    gc.collect()
    large = recycler.empty((2 * RECYCLED_BYTES,), np.uint8)
    assert large.nbytes == 2 * RECYCLED_BYTES and len(recycler.free) == 1
    large[...] = 7  # all of it is writable memory of its own
    assert int(large.sum()) == 7 * 2 * RECYCLED_BYTES


def test_small_and_object_arrays_come_from_numpy() -> None:
    recycler = Recycler()
    assert recycler.empty((10,), np.float32).base is None
    assert recycler.empty((RECYCLED_BYTES,), object).dtype == object


def test_threads_allocating_and_freeing_at_once_never_share_memory() -> None:
    recycler = Recycler(spare=2)
    errors: list[str] = []

    def work(value: int) -> None:
        for _ in range(50):
            batch = filled(recycler, value)
            if not (batch == value).all():
                errors.append(f"thread {value} saw another thread's values")
            del batch

    threads = [threading.Thread(target=work, args=(value,)) for value in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_to_its_own_copy() -> None:
    """As with ``malloc``'s memory: a child that changes a batch does not change its parent's."""
    recycler = Recycler()
    batch = filled(recycler, 1)
    spare = filled(recycler, 1)
    del spare
    gc.collect()  # one map waits in the recycler as well
    pid = os.fork()
    if pid == 0:  # the child: write everywhere it can, then leave without cleaning up
        batch[...] = 9
        recycler.empty(SHAPE, np.float32)[...] = 9
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert float(batch.min()) == float(batch.max()) == 1.0
    assert float(recycler.empty(SHAPE, np.float32).max()) == 1.0  # the spare map, as it was left


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_holds_the_lock_can_allocate() -> None:
    recycler = Recycler()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with recycler.lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(30)
    try:
        pid = os.fork()
        if pid == 0:  # the child: the thread holding the lock does not exist here
            batch = filled(recycler, 3)
            del batch
            gc.collect()
            os._exit(0 if len(recycler.free) == 1 else 1)
    finally:
        release.set()
        holder.join()
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the recycler's lock")
    assert done[1] == 0


def test_the_default_allocator_recycles() -> None:
    array = allocate.empty(SHAPE, np.float32)
    assert array.shape == SHAPE and array.dtype == np.float32 and array.flags.writeable
    assert not allocate.shared()


@pytest.mark.parametrize("shape", [(4, 4), SHAPE])
def test_a_maker_allocates_as_empty_does(shape: tuple[int, ...]) -> None:
    """A maker made while an allocator is installed uses it; made without, it makes arrays of
    recycled memory (large) or plain numpy ones (small), as ``empty`` does."""
    made = []

    def installed(shape: tuple[int, ...], dtype: object) -> np.ndarray:
        made.append(shape)
        return np.zeros(shape, dtype)

    allocate.install(installed)
    try:
        array = allocate.maker(shape, np.float32)()
    finally:
        allocate.install(None)
    assert made == [shape] and array.shape == shape and array.dtype == np.float32
    plain = allocate.maker(shape, np.float32)()
    assert plain.shape == shape and plain.dtype == np.float32
    assert (plain.base is not None) == (plain.nbytes >= RECYCLED_BYTES)  # a view of recycled memory
