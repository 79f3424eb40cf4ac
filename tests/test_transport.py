"""Batches sent from DataLoader workers through recycled shared memory: values and structure
arrive intact, a segment is reused only once the main process has freed every tensor in it,
and batches the user keeps or modifies are never touched by later batches."""

from __future__ import annotations

import gc
import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

import wdsx
from tests.fixtures.shards import write_tar
from wdsx.loader import transport

pytestmark = pytest.mark.skipif(not transport.AVAILABLE, reason="needs memfd_create")


def send(value, pool):
    """What the main process receives when a worker sends ``value``."""
    return pickle.loads(ForkingPickler.dumps(transport.pack(value, pool)))


def test_a_batch_arrives_with_its_structure_and_values():
    pool = transport.SegmentPool()
    images = torch.arange(64 * 32 * 32 * 3, dtype=torch.int32).reshape(64, 32, 32, 3) % 251
    batch = {
        "image": images.to(torch.uint8),
        "wide": images.to(torch.bfloat16),
        "columns": images[:, :, 0, 0].t(),  # not contiguous
        "labels": [torch.arange(64), ("key", 3)],
        "weights": torch.ones(3, requires_grad=True),  # left to torch's own pickling
    }
    received = send(batch, pool)
    assert set(received) == set(batch)
    for name in ("image", "wide", "columns"):
        assert received[name].dtype == batch[name].dtype
        assert torch.equal(received[name], batch[name])
    assert torch.equal(received["labels"][0], batch["labels"][0])
    assert received["labels"][1] == ("key", 3)
    assert received["weights"].requires_grad and torch.equal(received["weights"], batch["weights"])


def test_a_segment_is_reused_only_after_every_tensor_in_it_is_freed():
    pool = transport.SegmentPool()
    batch = (torch.zeros(64, 1024, dtype=torch.uint8), torch.ones(64))
    first = send(batch, pool)
    assert len(pool.segments) == 1
    images, labels = first
    del first, images
    gc.collect()
    send(batch, pool)  # labels still held: a second segment
    assert len(pool.segments) == 2
    del labels
    gc.collect()
    segment = pool.segments[0]
    assert not segment.held
    assert pool.take(64 * 1024 + 64 * 4) is segment


def test_small_batches_go_the_usual_way():
    batch = (torch.zeros(16), [torch.ones(8)])
    assert transport.pack(batch, transport.SegmentPool()) is batch


def array_for(index: int) -> np.ndarray:
    """The array stored in sample ``index``: distinct for every sample."""
    return (np.arange(48 * 48 * 3, dtype=np.int64).reshape(48, 48, 3) * 7 + index * 13) % 256


@pytest.fixture(scope="module")
def array_shards(tmp_path_factory):
    directory = tmp_path_factory.mktemp("arrays")
    urls = []
    for shard in range(4):
        members = []
        for index in range(shard * 30, shard * 30 + 30):
            data = io.BytesIO()
            np.save(data, array_for(index).astype(np.uint8))
            members += [(f"s{index:04d}.npy", data.getvalue()), (f"s{index:04d}.cls", b"%d" % index)]
        urls.append(write_tar(str(directory / f"a-{shard}.tar"), members))
    return urls


def array_loader(urls, **kwargs):
    dataset = wdsx.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls").batched(16)
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=2, **kwargs)


def assert_batch_matches_its_samples(images, labels):
    assert images.shape[1:] == (48, 48, 3)
    for image, label in zip(images, labels):
        assert np.array_equal(image.numpy(), array_for(int(label)))


@pytest.mark.parametrize("reuse", [True, False])
def test_batches_kept_by_the_user_are_never_overwritten(array_shards, reuse):
    kept = list(array_loader(array_shards, reuse_shared_memory=reuse))
    assert sorted(int(label) for _, labels in kept for label in labels) == list(range(120))
    for images, labels in kept:
        assert images.is_shared() != reuse  # which way the batch travelled
        assert_batch_matches_its_samples(images, labels)


def test_batches_modified_in_place_do_not_leak_into_later_ones(array_shards):
    count = 0
    for images, labels in array_loader(array_shards):
        assert_batch_matches_its_samples(images, labels)
        images.fill_(255)
        count += len(labels)
    assert count == 120


class Arrays(torch.utils.data.IterableDataset):
    """Not a wdsx pipeline: samples ``index`` with the array of ``array_for(index)``."""

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        for index in range(info.id, 40, info.num_workers):
            yield torch.from_numpy(array_for(index).astype(np.uint8)), index


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_a_dataset_that_is_not_a_wdsx_pipeline_is_sent_the_same_way(context):
    loader = wdsx.WebLoader(Arrays(), batch_size=16, num_workers=2, multiprocessing_context=context)
    batches = list(loader)
    assert sorted(int(label) for _, labels in batches for label in labels) == list(range(40))
    assert not batches[0][0].is_shared()
    for images, labels in batches:
        assert_batch_matches_its_samples(images, labels)
