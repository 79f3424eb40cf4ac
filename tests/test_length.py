"""len() of datasets and loaders: the number of items (batches) this rank actually yields in an
epoch, from the per-shard sample counts, for every rank, worker count and remainder policy.
The oracle is counting what an epoch yields. Ranks are simulated with RANK/WORLD_SIZE; the
torchrun jobs in test_multinode check the same on real ranks."""

from __future__ import annotations

import json

import pytest

import wdsx
from tests.fixtures.shards import make_shards

COUNTS = [13, 7, 22, 5, 9]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("length")), COUNTS)


def loader(data, workers, remainder, batch=4, partial=True):
    dataset = wdsx.WebDataset(data.urls, shardshuffle=True, counts=COUNTS, remainder=remainder)
    dataset = dataset.shuffle(5).to_tuple("__key__").batched(batch, partial=partial)
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def check_every_rank(monkeypatch, data, ranks, workers, remainder, partial=True):
    for rank in range(ranks):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        batches = loader(data, workers, remainder, partial=partial)
        expected = len(batches)
        assert sum(1 for _ in batches) == expected, (rank, ranks, workers, remainder)


@pytest.mark.parametrize("remainder", ["exact", "pad", "drop"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_len_is_what_each_rank_yields_without_workers(monkeypatch, data, ranks, remainder):
    check_every_rank(monkeypatch, data, ranks, 0, remainder)
    check_every_rank(monkeypatch, data, ranks, 0, remainder, partial=False)


@pytest.mark.slow  # 36 loader epochs with worker processes
@pytest.mark.parametrize("remainder", ["exact", "pad", "drop"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_len_is_what_each_rank_yields_with_workers(monkeypatch, data, workers, remainder):
    for ranks in (1, 2, 3, 4):
        check_every_rank(monkeypatch, data, ranks, workers, remainder)


def test_a_dataset_len_counts_samples_and_batches(data):
    dataset = wdsx.WebDataset(data.urls, counts=COUNTS).to_tuple("__key__")
    assert len(dataset) == sum(COUNTS) == sum(1 for _ in dataset)
    assert len(dataset.batched(8)) == sum(1 for _ in dataset.batched(8))
    assert len(dataset.batched(8, partial=False)) == sum(COUNTS) // 8


def test_a_resumed_loader_reports_what_is_left(data):
    batches = loader(data, 2, "exact")
    total = len(batches)
    iterator = iter(batches)
    for _ in range(5):
        next(iterator)
    state = json.loads(json.dumps(batches.state_dict()))
    del iterator
    batches.close()
    resumed = loader(data, 2, "exact")
    resumed.load_state_dict(state)
    assert len(resumed) == total - 5 == sum(1 for _ in resumed)
    assert len(resumed) == total


def test_a_mixture_len_under_stop_all(data, tmp_path):
    other = make_shards(str(tmp_path / "other"), [6, 6])
    mix = wdsx.Mix(
        [wdsx.WebDataset(data.urls, counts=COUNTS), wdsx.WebDataset(other.urls, counts=[6, 6])], stop="all"
    )
    assert len(mix) == sum(COUNTS) + 12 == sum(1 for _ in mix)


def test_unknown_counts_say_how_to_give_them(data):
    dataset = wdsx.WebDataset(data.urls, manifest=False)
    with pytest.raises(TypeError, match="manifest"):
        len(dataset)
    with pytest.raises(TypeError, match="unpredictably"):
        len(wdsx.WebDataset(data.urls, counts=COUNTS).select(lambda s: True))


def test_a_datasets_with_epoch_has_no_len_as_on_webdataset_and_a_loaders_has(data):
    """Each DataLoader worker yields a dataset's ``with_epoch(n)`` items, so a ``len()`` of
    ``n`` made Lightning end its epochs after half the batches of 2 workers."""
    import webdataset
    from torch.utils.data import DataLoader

    for library in (webdataset, wdsx):
        dataset = library.WebDataset(data.urls, shardshuffle=False).batched(2).with_epoch(10)
        with pytest.raises(TypeError):
            len(DataLoader(dataset, batch_size=None, num_workers=2))
    dataset = wdsx.WebDataset(data.urls, shardshuffle=False).batched(2).with_epoch(10)
    assert len(list(DataLoader(dataset, batch_size=None, num_workers=2))) == 20
    loader = wdsx.WebLoader(
        wdsx.WebDataset(data.urls, shardshuffle=False).batched(2), batch_size=None, num_workers=2
    )
    assert len(loader.with_epoch(10)) == 10 == len(list(loader))
