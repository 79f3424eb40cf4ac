"""``bucket``: batches whose items share a size bucket. The oracles are the test's own table of
each sample's length (written into hand-built tar shards) and bucket rule, item counts taken
at the stage's input, uninterrupted runs (for resume), and the full list of keys (for re-deals
across ranks and workers)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import dataclass

import pytest

import wdsx
from tests.fixtures.shards import write_tar
from wdsx.state import validate
from wdsx.state.position import PositionTable

BOUNDARIES = [64, 128, 256]


def bucket_of(length: int) -> int:
    """The bucket a length belongs to, written out by hand: below 64, 64-127, 128-255, 256 up."""
    if length < 64:
        return 0
    if length < 128:
        return 1
    if length < 256:
        return 2
    return 3


@dataclass
class Lengths:
    """Shards whose samples hold a ``.json`` with a ``len``, and that length by sample key."""

    urls: list[str]
    keys: list[str]
    length: dict[str, int]


def make_length_shards(directory: str, counts: list[int], seed: int = 0) -> Lengths:
    """Shards of samples whose lengths are skewed as real text is: mostly short, a few long."""
    rng = random.Random(seed)
    urls, keys, length = [], [], {}
    for shard, count in enumerate(counts):
        members = []
        for index in range(count):
            key = f"s{shard:02d}/{index:04d}"
            low, high = rng.choices([(1, 64), (64, 128), (128, 400)], weights=[8, 1, 1])[0]
            n = rng.randrange(low, high)
            keys.append(key)
            length[key] = n
            members.append((f"{key}.json", json.dumps({"len": n}).encode()))
        urls.append(write_tar(os.path.join(directory, f"shard-{shard:04d}.tar"), members))
    return Lengths(urls, keys, length)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Lengths:
    return make_length_shards(str(tmp_path_factory.mktemp("bucket")), [41, 37, 9, 52, 33, 40])


def length_field(value: dict) -> int:
    return value["len"]


def second(item: tuple) -> int:
    return item[1]


def items(urls: list[str], **dataset_args) -> wdsx.WebDataset:
    """``(key, length)`` pairs, shuffled."""
    dataset = wdsx.WebDataset(urls, shardshuffle=True, **dataset_args).shuffle(13).decode()
    return dataset.to_tuple("__key__", "json").map_tuple(None, length_field)


def bucketed(urls: list[str], batch_size: int = 4, max_held: int | None = 10, **args) -> wdsx.WebDataset:
    return items(urls, **args.pop("dataset_args", {})).bucket(
        second, BOUNDARIES, batch_size, max_held=max_held, **args
    )


def batch_keys(batch) -> list[str]:
    return list(batch[0])


def check_shared_buckets(batches: list, data: Lengths, batch_size: int) -> None:
    """Every batch's items share one bucket by the test's own rule, the collated lengths are
    the samples' lengths, and no batch is larger than asked."""
    for batch in batches:
        keys = batch_keys(batch)
        assert 1 <= len(keys) <= batch_size
        assert len({bucket_of(data.length[key]) for key in keys}) == 1, keys
        assert [int(n) for n in batch[1]] == [data.length[key] for key in keys]


def test_every_batch_shares_a_bucket_and_every_sample_comes_once(data):
    batches = list(bucketed(data.urls))
    check_shared_buckets(batches, data, 4)
    assert Counter(key for batch in batches for key in batch_keys(batch)) == Counter(data.keys)
    assert any(len(batch_keys(batch)) == 4 for batch in batches)


def test_lists_without_collation_and_bucket_ids_from_the_key(data):
    by_id = items(data.urls).bucket(
        lambda item: f"b{bucket_of(item[1])}", None, 5, max_held=12, collation_fn=None
    )
    batches = list(by_id)
    assert all(isinstance(batch, list) for batch in batches)
    columns = [([key for key, _ in batch], [n for _, n in batch]) for batch in batches]
    check_shared_buckets(columns, data, 5)
    assert Counter(key for keys, _ in columns for key in keys) == Counter(data.keys)


def test_without_partial_only_whole_batches_come_and_each_bucket_drops_its_remainder(data):
    batches = list(bucketed(data.urls, batch_size=4, max_held=None, partial=False))
    assert all(len(batch_keys(batch)) == 4 for batch in batches)
    check_shared_buckets(batches, data, 4)
    delivered = Counter(bucket_of(data.length[key]) for batch in batches for key in batch_keys(batch))
    present = Counter(bucket_of(data.length[key]) for key in data.keys)
    assert delivered == Counter({b: present[b] // 4 * 4 for b in present if present[b] >= 4})


@pytest.mark.parametrize("by_id", [False, True])
def test_items_held_never_exceed_max_held_on_a_skewed_stream(data, by_id):
    """The stage's input is counted as it pulls; what it holds when it emits a batch is what
    it pulled minus what it emitted before. Keyed by the exact length (many buckets, most
    with one or two items), only the cap bounds memory. A short batch before the input ends
    is one the cap forced: it must be one of the fullest buckets."""
    pulled: list[str] = []

    def count(item):
        pulled.append(item[0])
        return item

    def group(key: str) -> int:
        return data.length[key] if by_id else bucket_of(data.length[key])

    batch_size = 4 if by_id else 8
    stream = items(data.urls).map(count).bucket(second, None if by_id else BOUNDARIES, batch_size, max_held=9)
    emitted: list[str] = []
    most, forced = 0, 0
    for batch in stream:
        keys = batch_keys(batch)
        held = Counter(pulled) - Counter(emitted)
        most = max(most, sum(held.values()))
        if len(pulled) < len(data.keys) and len(keys) < batch_size:
            forced += 1
            sizes = Counter(group(key) for key in held.elements())
            assert len(keys) == max(sizes.values())  # the fullest bucket went first
        emitted += keys
    assert most == 9  # the cap was reached, and never passed
    assert forced > 0  # ... and emitting a bucket early is what kept it there
    assert Counter(emitted) == Counter(data.keys)


def test_a_checkpoint_holds_the_positions_of_the_items_held(data):
    pulled: list[str] = []
    stream = items(data.urls).map(lambda item: pulled.append(item[0]) or item).bucket(second, BOUNDARIES, 4)
    emitted: list[str] = []
    iterator = iter(stream)
    for _ in range(7):
        emitted += batch_keys(next(iterator))
    state = json.loads(json.dumps(stream.state_dict()))
    saved = state["stages"]["bucket"]
    positions = iter(PositionTable(state["urls"]).decode(saved["positions"]))
    shard_of = {url: f"s{i:02d}" for i, url in enumerate(data.urls)}
    buckets = [(bucket_id, [next(positions) for _ in range(count)]) for bucket_id, count in saved["buckets"]]
    arrived = {
        bucket_id: [pulled.index(f"{shard_of[p.url]}/{p.ordinal:04d}") for p in held]
        for bucket_id, held in buckets
    }
    held_keys = [pulled[i] for times in arrived.values() for i in times]
    assert Counter(held_keys) == Counter(pulled) - Counter(emitted)
    for bucket_id, times in arrived.items():
        assert {bucket_of(data.length[pulled[i]]) for i in times} == {bucket_id}
        assert times == sorted(times)  # in the order they arrived
    # the order of emission: fullest first, and among equally full the first to get there
    assert [(-len(t), t[-1]) for t in arrived.values()] == sorted((-len(t), t[-1]) for t in arrived.values())
    assert len(arrived) >= 2


def test_a_tampered_bucket_state_is_refused(data):
    stream = bucketed(data.urls, max_held=None)
    iterator = iter(stream)
    for _ in range(3):
        next(iterator)
    state = json.loads(json.dumps(stream.state_dict()))
    state["stages"]["bucket"]["buckets"][0][0] = 9  # a bucket that three boundaries cannot make
    resumed = bucketed(data.urls, max_held=None)
    with pytest.raises(validate.InvalidState, match=r"stages\.bucket\.buckets"):  # at load, not later
        resumed.load_state_dict(validate.signed({k: v for k, v in state.items() if k != "digest"}))
    state["stages"]["bucket"]["buckets"][0][1] += 1  # more items than positions
    with pytest.raises(validate.InvalidState, match=r"stages\.bucket\.positions"):
        resumed.load_state_dict(validate.signed({k: v for k, v in state.items() if k != "digest"}))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_held"):
        wdsx.bucket(second, None, 4)
    with pytest.raises(ValueError, match="increase"):
        wdsx.bucket(second, [10, 10], 4)
    with pytest.raises(ValueError, match="at least batch_size"):
        wdsx.bucket(second, [10], 4, max_held=3)
    with pytest.raises(TypeError, match="bucket id"):
        list(wdsx.bucket(lambda item: 1.5, None, 2, max_held=4)([1, 2]))


def loader(urls: list[str], workers: int, main_process: bool = False) -> wdsx.WebLoader:
    """A loader bucketing in its workers, or (``main_process``) in the main process after the
    workers' batches are taken apart again."""
    if main_process:
        dataset = items(urls).batched(3)
        return (
            wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
            .unbatched()
            .bucket(second, BOUNDARIES, 4, max_held=7)
        )
    return wdsx.WebLoader(bucketed(urls, max_held=7), batch_size=None, num_workers=workers)


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
@pytest.mark.parametrize("main_process", [False, True])
def test_check_resume_passes_across_an_epoch_boundary(data, main_process):
    report = wdsx.check_resume(lambda: loader(data.urls, 0, main_process), cuts=5, epochs=2)
    assert report.identical, str(report)
    assert len(report.cuts) >= 5


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
@pytest.mark.parametrize("on_loader", [False, True])
def test_check_resume_passes_with_an_epoch_length_in_batches(data, on_loader):
    def make():
        if on_loader:
            return wdsx.WebLoader(bucketed(data.urls), batch_size=None, num_workers=0).with_epoch(35)
        return wdsx.WebLoader(bucketed(data.urls).with_epoch(35), batch_size=None, num_workers=0)

    report = wdsx.check_resume(make, cuts=3, epochs=3)  # 105 batches: past the end of the data's epoch
    assert report.identical, str(report)


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_check_resume_passes_when_the_cap_often_picks_among_equally_full_buckets(data):
    """Keyed by the exact length, most buckets hold one item when the cap is reached: which
    one goes first depends on the order of the buckets, which a resume must restore."""
    report = wdsx.check_resume(lambda: items(data.urls).bucket(second, None, 3, max_held=6), cuts=8, epochs=2)
    assert report.identical, str(report)


@pytest.mark.slow  # three cut-and-resume runs per worker count, each starting worker processes
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("main_process", [False, True])
def test_check_resume_passes_with_workers(data, workers, main_process):
    report = wdsx.check_resume(lambda: loader(data.urls, workers, main_process), cuts=3, epochs=2)
    assert report.identical, str(report)


def redealt(data: Lengths, monkeypatch, old: tuple[int, int], new: tuple[int, int], taken: int) -> None:
    """Run ``old`` = (ranks, workers) for ``taken`` batches per rank, gather the ranks' states,
    resume on ``new`` and finish the epoch: every sample comes exactly once, in batches that
    still share a bucket."""

    def make(workers: int) -> wdsx.WebLoader:
        dataset = bucketed(data.urls, max_held=7, dataset_args={"counts": "scan", "remainder": "exact"})
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)

    (old_ranks, old_workers), (new_ranks, new_workers) = old, new
    consumed, states, after = [], [], []
    for rank in range(old_ranks):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(old_ranks))
        first = make(old_workers)
        iterator = iter(first)
        consumed += [next(iterator) for _ in range(taken)]
        states.append(json.loads(json.dumps(first.state_dict())))
        del iterator
        first.close()
    everything = {"format": "wdsx-global-state", "version": 1, "ranks": states}
    for rank in range(new_ranks):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(new_ranks))
        second_run = make(new_workers)
        second_run.load_state_dict(json.loads(json.dumps(everything)))
        after += list(second_run)
    check_shared_buckets(consumed + after, data, 4)
    assert Counter(key for batch in consumed + after for key in batch_keys(batch)) == Counter(data.keys)


def test_an_elastic_re_deal_delivers_every_sample_once(data, monkeypatch):
    redealt(data, monkeypatch, (2, 0), (3, 0), taken=5)


@pytest.mark.slow  # eleven loaders with worker processes
def test_four_ranks_of_two_workers_re_dealt_to_three_of_one(data, monkeypatch):
    redealt(data, monkeypatch, (4, 2), (3, 1), taken=3)


def test_ranks_read_equal_shares_and_with_epoch_gives_equal_batch_counts(data, monkeypatch):
    """The loader's equalisation deals every rank the same number of samples; how many batches
    bucketing makes of them depends on their sizes, so equal batch counts come from
    ``with_epoch(n)``."""
    samples, batches = [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        whole = list(wdsx.WebLoader(bucketed(data.urls), batch_size=None, num_workers=0))
        samples.append(sum(len(batch_keys(batch)) for batch in whole))
        per_worker = wdsx.WebLoader(bucketed(data.urls).with_epoch(20), batch_size=None, num_workers=0)
        per_rank = wdsx.WebLoader(bucketed(data.urls), batch_size=None, num_workers=0).with_epoch(15)
        batches.append([len(list(per_worker)) for _ in range(3)] + [len(list(per_rank)) for _ in range(3)])
    assert len(set(samples)) == 1 and samples[0] * 3 >= len(data.keys)
    assert batches == [[20, 20, 20, 15, 15, 15]] * 3
