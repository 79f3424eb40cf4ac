"""Subclasses written for webdataset override its hooks; wdsx calls them where webdataset does.

A ``WebDataset`` subclass may override ``create_url_iterator`` (and ``update_cache_info``),
a shard list subclass its ``__iter__``. The oracle for what they read is webdataset 1.0.2
running the same subclass; the oracle for resuming is the uninterrupted run.
"""

from __future__ import annotations

import random

import pytest
import webdataset

import wdsx
from tests.fixtures.shards import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("hooks")), [3, 1, 4, 1, 5, 9, 2, 6])


def epoch_shard_list(library):
    """A shard list that reshuffles every epoch from a counter it keeps, as some training
    code subclasses webdataset's."""

    class EpochShardList(library.SimpleShardList):
        def __init__(self, urls, seed):
            super().__init__(urls, seed)
            self.epoch = -1

        def __iter__(self):
            self.epoch += 1
            urls = list(self.urls)
            random.Random(self.seed + self.epoch).shuffle(urls)
            return iter([{"url": url} for url in urls])

    return EpochShardList


def own_urls(library):
    class OwnUrls(library.WebDataset):
        def create_url_iterator(self, args):
            self.append(epoch_shard_list(library)(args.urls, seed=11))

    return OwnUrls


def keys(dataset, epochs: int = 2) -> list[list[str]]:
    return [[sample["__key__"] for sample in dataset] for _ in range(epochs)]


def test_an_own_url_iterator_reads_what_webdataset_reads(shards):
    def read(library, **options):
        return keys(own_urls(library)(shards.urls, shardshuffle=3, seed=4, **options))

    assert read(wdsx) == read(webdataset)
    assert read(wdsx, detshuffle=True) == read(webdataset, detshuffle=True)


@pytest.mark.slow  # WebLoader worker processes at each cut
def test_an_own_url_iterator_resumes_exactly_in_workers(shards):
    """Each epoch's workers iterate a fresh copy of the shard list, so the count it keeps
    is the same in a resumed run."""

    def loader():
        dataset = own_urls(wdsx)(shards.urls, shardshuffle=3, detshuffle=True, seed=4)
        return wdsx.WebLoader(dataset.to_tuple("__key__").batched(2), batch_size=None, num_workers=2)

    report = wdsx.check_resume(loader, cuts=4, epochs=2)
    assert report.identical, str(report)


def test_an_own_shard_list_is_not_checkpointed_once_it_has_counted_in_process(shards):
    """In one process the list's own count goes on across epochs, and a resumed run's fresh
    object would start it afresh: after the first epoch a checkpoint is refused, naming it."""

    def pipeline(library):
        listed = epoch_shard_list(library)(shards.urls, seed=3)
        return library.DataPipeline(listed, library.tarfile_to_samples())

    ours = pipeline(wdsx)
    assert keys(ours) == keys(pipeline(webdataset))
    with pytest.raises(wdsx.NotResumableError, match="EpochShardList iterates itself"):
        ours.state_dict()
    first = pipeline(wdsx)
    next(iter(first))
    assert first.state_dict()["epoch"] == 0  # in its first epoch it resumes exactly


def test_an_own_url_iterator_refuses_the_planners_arguments(shards):
    with pytest.raises(ValueError, match="without wdsx's planner, and cannot use counts, remainder"):
        own_urls(wdsx)(shards.urls, counts=shards.counts, remainder="pad")


def test_an_own_url_iterator_selects_files_by_glob(shards):
    dataset = own_urls(wdsx)(shards.urls, shardshuffle=False, select_files="*.cls")
    assert {name for sample in dataset for name in sample if not name.startswith("__")} == {"cls"}
