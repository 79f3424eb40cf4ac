"""Unshuffled shards reach ranks and DataLoader workers in webdataset's order.

webdataset splits the shard list round-robin, first by rank (``split_by_node``: every
``world_size``-th shard from the rank) and then by worker (``split_by_worker``), and a
DataLoader hands out the workers' batches in turn. That order is deterministic, so programs
written for webdataset expect it. The oracle is webdataset 1.0.2 running the same code on the
same shards, with the rank given by ``RANK``/``WORLD_SIZE`` as under torchrun.
"""

from __future__ import annotations

import pytest
import torch
import webdataset

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.read import deal as planning

UNEVEN = [37, 37, 5, 37, 37, 61, 37]


def batches(library, urls, workers: int, **options) -> list[list[str]]:
    """The keys of every batch a DataLoader yields from the library's WebDataset."""
    dataset = (
        library.WebDataset(urls, shardshuffle=False, nodesplitter=library.split_by_node, **options)
        .to_tuple("__key__")
        .batched(4)
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    return [list(batch[0]) for batch in loader]


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_one_rank_reads_in_webdataset_order(tmp_path, workers):
    urls = make_shards(str(tmp_path), UNEVEN).urls
    assert batches(wdsx, urls, workers) == batches(webdataset, urls, workers)


@pytest.mark.parametrize(
    ("counts", "options"),
    [
        ([10] * 8, {}),  # equal shares: the default remainder policy changes nothing
        (UNEVEN + [3], {"remainder": "exact"}),  # unequal shares, read as they fall
    ],
)
def test_every_rank_reads_in_webdataset_order(tmp_path, monkeypatch, counts, options):
    urls = make_shards(str(tmp_path), counts).urls
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        assert batches(wdsx, urls, 2, **options) == batches(webdataset, urls, 2), rank


def test_even_shares_keep_each_reader_on_its_own_shards():
    """With ``pad`` across ranks the round-robin shares are cut to equal sizes: every sample
    is dealt once, and shares differ by at most one sample."""
    counts = [37, 37, 5, 37, 37, 61, 37, 11, 2]
    plans = planning.plan_round_robin(2, 2, counts, len(counts), remainder="pad")
    sizes = []
    dealt: list[tuple[int, int]] = []
    for plan in plans:
        size = 0
        for span in plan.spans:
            for piece in planning.pieces(span):
                stop = counts[piece.pos] if piece.stop is None else piece.stop
                dealt.extend((piece.pos, ordinal) for ordinal in range(piece.first, stop))
                size += stop - piece.first
        sizes.append(size)
    assert sorted(dealt) == [(pos, i) for pos, count in enumerate(counts) for i in range(count)]
    assert max(sizes) - min(sizes) <= 1
