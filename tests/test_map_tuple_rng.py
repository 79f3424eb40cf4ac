"""Per-sample randomness in maps that see only a field: ``map_tuple(..., rng=True)`` and
``wdsx.current_rng()``. The draws differ from sample to sample, depend on the sample alone
(the same under another shuffle buffer or number of workers), change with the epoch, and are
the same after a resume (``check_resume``, whose oracle is the uninterrupted run), including
when a buffer after the random map is restored by re-reading its samples."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import wdsx
from tests.fixtures.shards import make_shards


def noisy(text: bytes) -> tuple[str, int]:
    """An 'augmentation' that only sees a field: the text with a random draw beside it."""
    return text.decode(), int(wdsx.current_rng().integers(0, 2**40))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("rng")), [13, 21, 8, 17])


def pipeline(shards, buffer: int = 7, after: int = 0) -> wdsx.DataPipeline:
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, manifest=False).shuffle(buffer)
    dataset = dataset.to_tuple("__key__", "txt").map_tuple(None, noisy, rng=True)
    return dataset.shuffle(after) if after else dataset


def draws_by_key(items) -> dict[str, int]:
    return {key: draw for key, (_, draw) in items}


def test_every_sample_gets_its_own_draws(shards):
    items = list(pipeline(shards))
    draws = draws_by_key(items)
    assert sorted(draws) == sorted(shards.keys)
    assert len(set(draws.values())) == len(draws)


def test_the_draws_depend_on_the_sample_alone(shards):
    """Another shuffle buffer (another order) and two DataLoader workers give each sample the
    same draw."""
    reference = draws_by_key(pipeline(shards, buffer=7))
    assert draws_by_key(pipeline(shards, buffer=23)) == reference
    loader = wdsx.WebLoader(pipeline(shards, buffer=3), batch_size=None, num_workers=2)
    assert draws_by_key(loader) == reference


def test_each_epoch_draws_anew(shards):
    dataset = pipeline(shards)
    first, second = draws_by_key(dataset), draws_by_key(dataset)
    assert first.keys() == second.keys()
    assert all(first[key] != second[key] for key in first)


def test_two_random_maps_draw_different_numbers(shards):
    dataset = wdsx.WebDataset(shards.urls, manifest=False).to_tuple("__key__", "txt", "txt")
    dataset = dataset.map_tuple(None, noisy, rng=True).map_tuple(None, None, noisy, rng=True)
    for _, (_, a), (_, b) in dataset:
        assert a != b


def test_current_rng_outside_a_random_map_says_how_to_get_one():
    with pytest.raises(RuntimeError, match="rng=True"):
        wdsx.current_rng()


def test_a_plain_map_may_draw_too(shards):
    def tag(sample):
        sample["draw"] = int(wdsx.current_rng("torch").seed())
        return sample

    dataset = wdsx.WebDataset(shards.urls, manifest=False).map(tag, rng=True).to_tuple("__key__", "draw")
    draws = dict(dataset)
    assert len(set(draws.values())) == len(draws) == len(shards.keys)


@pytest.mark.parametrize("after", [0, 9], ids=["batched", "shuffled-after"])
def test_a_pipeline_with_a_random_map_resumes_exactly(shards, after):
    """With a shuffle after the random map, a restored checkpoint re-reads the buffered
    samples and replays the random map on them: their draws must be the ones they had."""
    report = wdsx.check_resume(lambda: pipeline(shards, after=after).batched(4), cuts=5, epochs=2)
    assert report.identical, str(report)


@pytest.mark.slow  # worker processes
def test_a_loader_with_a_random_map_resumes_exactly(shards):
    report = wdsx.check_resume(
        lambda: wdsx.WebLoader(pipeline(shards, after=5).batched(3), batch_size=None, num_workers=2), cuts=3
    )
    assert report.identical, str(report)


@pytest.mark.slow  # worker processes
def test_a_re_deal_to_more_workers_keeps_every_draw(shards):
    """Cut a 2-worker loader with samples held in shuffle buffers and re-deal its state to 3
    workers: every sample comes exactly once, with the draw the uninterrupted run in one
    process gave it (the oracle)."""
    reference = draws_by_key(pipeline(shards))
    first = wdsx.WebLoader(pipeline(shards), batch_size=None, num_workers=2)
    iterator = iter(first)
    before = [next(iterator) for _ in range(20)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = wdsx.WebLoader(pipeline(shards), batch_size=None, num_workers=3)
    resumed.load_state_dict(state)
    after = list(resumed)
    assert Counter(key for key, _ in before + after) == Counter(shards.keys)
    assert draws_by_key(before + after) == reference
