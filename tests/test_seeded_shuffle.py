"""Seeded shuffles, of samples and of shards, give webdataset's order element for element,
and still resume exactly.

The oracle for the order is webdataset 1.0.2 itself (same input, same seed); the oracle for
resuming is the uninterrupted run. Old checkpoints of a seeded shuffle (written when it drew
from wdsx's counter-based stream) finish their epoch on that stream.
"""

from __future__ import annotations

import json
import random

import pytest
import webdataset
import webdataset.filters

import wdsx
import wdsx.filters
from tests.fixtures.shards import make_shards
from tests.fixtures.trials import resume_trial
from wdsx.core.rng import CountingRandom

SEEDS = [0, 1, 7, 2**40 + 3]
BUFFERS = [(1, 1), (7, 0), (10, 3), (100, 100), (1000, 100)]


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("two")), [30, 23])


def keys(samples) -> list[str]:
    return [sample["__key__"] for sample in samples]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("bufsize", "initial"), BUFFERS)
def test_the_shuffle_generator_makes_webdatasets_draws(seed, bufsize, initial):
    data = list(range(400))
    theirs = list(webdataset.filters._shuffle(iter(data), bufsize, initial, rng=random.Random(seed)))
    assert list(wdsx.filters._shuffle(iter(data), bufsize, initial, rng=random.Random(seed))) == theirs
    theirs = list(webdataset.filters._shuffle(iter(data), bufsize, initial, seed=seed))
    assert list(wdsx.filters._shuffle(iter(data), bufsize, initial, seed=seed)) == theirs


def test_pick_makes_webdatasets_draws():
    theirs, ours = list(range(50)), list(range(50))
    rng_theirs, rng_ours = random.Random(3), random.Random(3)
    picked = [webdataset.filters.pick(theirs, rng_theirs) for _ in range(50)]
    assert [wdsx.filters.pick(ours, rng_ours) for _ in range(50)] == picked


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_seeded_shuffle_stage_gives_webdatasets_order_every_epoch(two_shards, seed):
    def epochs(library, **options):
        dataset = library.WebDataset(two_shards.urls, shardshuffle=False, **options).shuffle(10, seed=seed)
        return [keys(dataset) for _ in range(2)]

    assert epochs(wdsx, manifest=False) == epochs(webdataset)

    def pipeline_epochs(library):
        stages = [library.SimpleShardList(two_shards.urls), library.tarfile_to_samples()]
        dataset = library.DataPipeline(*stages, library.shuffle(20, initial=5, seed=seed))
        return [keys(dataset) for _ in range(2)]

    assert pipeline_epochs(wdsx) == pipeline_epochs(webdataset)


@pytest.mark.parametrize(("seed", "epoch"), [(0, -1), (5, 3), (11, -4)])
def test_detshuffle_gives_webdatasets_order_epoch_after_epoch(two_shards, seed, epoch):
    def epochs(library):
        stages = [library.SimpleShardList(two_shards.urls), library.tarfile_to_samples()]
        dataset = library.DataPipeline(*stages, library.detshuffle(15, 4, seed=seed, epoch=epoch))
        return [keys(dataset) for _ in range(3)]

    theirs = epochs(webdataset)
    assert epochs(wdsx) == theirs
    assert theirs[0] != theirs[1] != theirs[2]


def test_detshuffle_is_a_class_code_can_subclass(two_shards):
    """webdataset's detshuffle is a class: code subclasses it (here, a fixed seed of its own)
    and tests for it with isinstance; both work, and give webdataset's order."""

    def order(library):
        class SeededSeven(library.detshuffle):
            def __init__(self, bufsize):
                super().__init__(bufsize, 4, seed=7)

        stage = SeededSeven(15)
        assert isinstance(stage, library.detshuffle)
        stages = [library.SimpleShardList(two_shards.urls), library.tarfile_to_samples()]
        return keys(library.DataPipeline(*stages, stage))

    assert order(wdsx) == order(webdataset)


@pytest.mark.slow  # DataLoader worker processes, twice
def test_seeded_shuffle_in_each_worker_gives_webdatasets_batches(two_shards):
    def batches(library, **options):
        dataset = library.WebDataset(two_shards.urls, shardshuffle=False, **options)
        dataset = dataset.shuffle(10, initial=4, seed=5).to_tuple("__key__").batched(4)
        loader = library.WebLoader(dataset, batch_size=None, num_workers=2)
        return [list(batch[0]) for _ in range(2) for batch in loader]

    assert batches(wdsx, manifest=False) == batches(webdataset)


def build_seeded(urls, bufsize=10, workers=None):
    dataset = wdsx.WebDataset(urls, shardshuffle=False, manifest=False).shuffle(bufsize, initial=3, seed=9)
    dataset = dataset.to_tuple("__key__", "cls").batched(4)
    return dataset if workers is None else wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


@pytest.mark.parametrize("cut", [0.05, 0.3, 0.5, 0.51, 0.9])
def test_seeded_shuffle_resumes_exactly(two_shards, cut):
    full = resume_trial(lambda: build_seeded(two_shards.urls), cut)
    theirs = webdataset.WebDataset(two_shards.urls, shardshuffle=False).shuffle(10, initial=3, seed=9)
    assert [key for batch in full for key in batch] == keys(theirs) * 2


def test_detshuffle_resumes_exactly_at_every_cut(two_shards):
    def build():
        stages = [wdsx.SimpleShardList(two_shards.urls), wdsx.tarfile_to_samples()]
        shuffled = wdsx.DataPipeline(*stages, wdsx.detshuffle(12, 5, seed=4), wdsx.to_tuple("__key__"))
        return shuffled.batched(3)

    report = wdsx.check_resume(build, cuts=6, epochs=3)
    assert report.identical, str(report)


@pytest.mark.slow  # DataLoader worker processes at each cut
@pytest.mark.parametrize("cut", [0.2, 0.7])
def test_seeded_shuffle_resumes_exactly_across_workers(two_shards, cut):
    resume_trial(lambda: build_seeded(two_shards.urls, bufsize=100, workers=2), cut)


def test_a_checkpoint_holds_the_words_drawn(two_shards):
    dataset = build_seeded(two_shards.urls)
    next(iter(dataset))  # one batch: four picks
    state = json.loads(json.dumps(dataset.state_dict()))["stages"]["shuffle"]
    counting = CountingRandom(9)
    shuffled = webdataset.filters._shuffle(iter(two_shards.keys), 10, 3, rng=counting)
    for _ in range(4):
        next(shuffled)
    assert (state["draws"], state["words"]) == (4, counting.words)


def test_a_checkpoint_from_before_seeded_shuffles_followed_webdataset_finishes_its_epoch(two_shards):
    # The seeded shuffle used to draw from the counter-based stream that an unseeded shuffle
    # draws from when the pipeline's seed is the shuffle's seed: such a run is the oracle.
    def build(seeded):
        dataset = wdsx.WebDataset(two_shards.urls, shardshuffle=False, manifest=False, seed=9)
        dataset = dataset.shuffle(10, initial=3, seed=9 if seeded else None)
        return dataset.to_tuple("__key__").batched(4)

    old = build(seeded=False)
    batches = [list(batch[0]) for batch in old]
    saved_after = 5
    old = build(seeded=False)
    iterator = iter(old)
    for _ in range(saved_after):
        next(iterator)
    state = json.loads(json.dumps(old.state_dict()))
    assert "words" not in state["stages"]["shuffle"]
    resumed = build(seeded=True)
    resumed.load_state_dict(state)
    assert [list(batch[0]) for batch in resumed] == batches[saved_after:]
    later_epoch = [key for batch in resumed for key in batch[0]]
    theirs = webdataset.WebDataset(two_shards.urls, shardshuffle=False).shuffle(10, initial=3, seed=9)
    assert later_epoch == keys(theirs)


# --- seeded shard shuffles: each reader shuffles its own shards, as in webdataset -----------
SHARD_SHUFFLES = [
    {"shardshuffle": 100, "seed": 7},
    {"shardshuffle": 5, "seed": 3},
    {"shardshuffle": True, "seed": 11},
    {"shardshuffle": 4, "seed": 5, "detshuffle": True},
]


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("many")), [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9] * 2)


def loader_epochs(library, urls, workers: int, epochs: int = 2, **options) -> list[list[str]]:
    """Each epoch's keys from a torch DataLoader (persistent workers, as webdataset's
    ``detshuffle`` needs to count epochs in workers) over the library's WebDataset."""
    import torch

    dataset = library.WebDataset(urls, **options).to_tuple("__key__").batched(3)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, persistent_workers=workers > 0
    )
    return [[key for batch in loader for key in batch[0]] for _ in range(epochs)]


@pytest.mark.parametrize("options", SHARD_SHUFFLES)
def test_a_seeded_shard_shuffle_gives_webdatasets_order(many_shards, options):
    theirs = loader_epochs(webdataset, many_shards.urls, 0, 3, **options)
    assert loader_epochs(wdsx, many_shards.urls, 0, 3, manifest=False, **options) == theirs
    assert (theirs[0] != theirs[1]) == bool(options.get("detshuffle"))


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("options", [SHARD_SHUFFLES[1], SHARD_SHUFFLES[3]])
def test_a_seeded_shard_shuffle_gives_webdatasets_order_in_workers(many_shards, workers, options):
    theirs = loader_epochs(webdataset, many_shards.urls, workers, **options)
    assert loader_epochs(wdsx, many_shards.urls, workers, manifest=False, **options) == theirs


@pytest.mark.slow  # DataLoader worker processes on two ranks
def test_a_seeded_shard_shuffle_gives_webdatasets_order_on_every_rank(many_shards, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        options = {"nodesplitter": webdataset.split_by_node, **SHARD_SHUFFLES[1]}
        theirs = loader_epochs(webdataset, many_shards.urls, 2, **options)
        options["nodesplitter"] = wdsx.split_by_node
        ours = loader_epochs(wdsx, many_shards.urls, 2, manifest=False, remainder="exact", **options)
        assert ours == theirs, rank


@pytest.mark.parametrize("text", ["7", "07", "not a number"])
@pytest.mark.parametrize("where", ["argument", "environment"])
def test_a_text_seed_or_wds_seed_gives_webdatasets_order(many_shards, monkeypatch, text, where):
    """webdataset seeds with ``$WDS_SEED`` when no seed is given, as text, which draws
    otherwise than the number; a seed given as text does the same, whatever the text."""
    monkeypatch.setenv("WDS_SEED", text)
    given = {"seed": text} if where == "argument" else {}
    theirs = loader_epochs(webdataset, many_shards.urls, 0, shardshuffle=5, **given)
    assert loader_epochs(wdsx, many_shards.urls, 0, manifest=False, shardshuffle=5, **given) == theirs


def seeded_shards_loader(urls, workers: int):
    dataset = wdsx.WebDataset(urls, shardshuffle=4, seed=5, detshuffle=True).to_tuple("__key__")
    return wdsx.WebLoader(dataset.batched(3), batch_size=None, num_workers=workers)


@pytest.mark.slow  # WebLoader worker processes at each cut
def test_a_seeded_shard_shuffle_resumes_exactly(many_shards):
    report = wdsx.check_resume(lambda: seeded_shards_loader(many_shards.urls, 2), cuts=3, epochs=2)
    assert report.identical, str(report)


@pytest.mark.slow  # WebLoader worker processes, on three worker counts
@pytest.mark.parametrize("resumed_on", [0, 3])
def test_a_seeded_shard_shuffle_resumed_on_other_workers_reads_each_sample_once(many_shards, resumed_on):
    first = seeded_shards_loader(many_shards.urls, 2)
    batches = iter(first)
    seen = [key for _ in range(9) for key in next(batches)[0]]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    first.close()
    resumed = seeded_shards_loader(many_shards.urls, resumed_on)
    resumed.load_state_dict(state)
    seen += [key for batch in resumed for key in batch[0]]
    assert sorted(seen) == sorted(many_shards.keys)
    assert len(seen) == len(many_shards.keys)


@pytest.mark.parametrize("seed", [0, 12345, "text seed"])
def test_counting_random_draws_what_random_draws_and_skips_to_where_it_stopped(seed):
    counting, plain = CountingRandom(seed), random.Random(seed)
    bounds = [1, 1, 2, 3, 1000, 2**31 + 1, 2**32 + 7, 2**70, 1]
    for bound in bounds * 20:
        assert counting.randint(0, bound - 1) == plain.randint(0, bound - 1)
        assert counting.random() == plain.random()
    items = list(range(30))
    counting.shuffle(items)
    plain.shuffle(expected := list(range(30)))
    assert items == expected
    assert counting.choice(items) == plain.choice(expected)
    assert counting.sample(items, 5) == plain.sample(expected, 5)
    assert counting.getstate() == plain.getstate()
    fresh = CountingRandom(seed)
    fresh.skip(counting.words)
    assert fresh.getstate() == plain.getstate() and fresh.words == counting.words
