"""Mixing weights that follow a schedule: the sources' shares per phase match the schedule (a
chi-square test at p = 0.001 against the weights the schedule declares), a resumed mixture
equals the uninterrupted one (``check_resume``), and a mixture re-dealt to other workers
delivers every sample once and goes on with the schedule where the job was."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

import wdsx
from tests.fixtures.shards import make_shards

CHI2_CRITICAL_P001_1DOF = 10.828
"""Upper 0.001 quantile of the chi-square distribution with one degree of freedom."""


def chi_square(observed: list[int], weights: list[float]) -> float:
    total = sum(observed)
    expected = [total * w / sum(weights) for w in weights]
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected))


def endless_pair() -> list[wdsx.DataPipeline]:
    """Two in-memory sources whose items name their source."""
    return [wdsx.DataPipeline([k] * 1000) for k in range(2)]


def test_piecewise_schedules_give_the_weights_of_their_points():
    constant = wdsx.PiecewiseConstant([(0, [1, 1]), (100, [1, 3])])
    assert constant(0) == constant(99) == [1.0, 1.0]
    assert constant(100) == constant(10**9) == [1.0, 3.0]
    linear = wdsx.PiecewiseLinear([(0, [1, 0]), (100, [1, 2]), (300, [0, 2])])
    assert linear(0) == [1.0, 0.0]
    assert linear(50) == [1.0, 1.0]
    assert linear(200) == [0.5, 2.0]
    assert linear(300) == linear(5000) == [0.0, 2.0]


@pytest.mark.parametrize(
    "points",
    [[], [(5, [1, 1])], [(0, [1, 1]), (0, [1, 2])], [(0, [1, 1]), (10, [1])], [(0, [0, 0])], [(0, [-1, 2])]],
    ids=["empty", "late-start", "not-increasing", "ragged", "zero-sum", "negative"],
)
def test_bad_schedules_are_refused(points):
    with pytest.raises(ValueError):
        wdsx.PiecewiseConstant(points)


def test_a_schedule_giving_the_wrong_number_of_weights_is_refused_when_the_mixture_is_made():
    with pytest.raises(ValueError, match="2 non-negative numbers"):
        wdsx.Mix(endless_pair(), lambda drawn: [1, 2, 3])


def test_each_phase_of_a_piecewise_constant_schedule_mixes_in_its_own_proportions():
    schedule = wdsx.PiecewiseConstant([(0, [1, 1]), (8000, [1, 3]), (16000, [4, 1])])
    mix = wdsx.Mix(endless_pair(), schedule, stop="never", seed=11)
    drawn = list(itertools.islice(iter(mix), 24000))
    for start, weights in [(0, [1, 1]), (8000, [1, 3]), (16000, [4, 1])]:
        phase = drawn[start : start + 8000]
        observed = [phase.count(0), phase.count(1)]
        assert chi_square(observed, weights) < CHI2_CRITICAL_P001_1DOF, (start, observed)


def test_a_piecewise_linear_schedule_moves_the_proportions_gradually():
    """Source 1's weight rises linearly from 0 to 1 (source 0's stays 1): over each window of
    draws, source 1's expected share is the mean over the window of w1 / (1 + w1)."""
    schedule = wdsx.PiecewiseLinear([(0, [1, 0]), (20000, [1, 1])])
    mix = wdsx.Mix(endless_pair(), schedule, stop="never", seed=5)
    drawn = list(itertools.islice(iter(mix), 20000))
    for start in range(0, 20000, 5000):
        window = drawn[start : start + 5000]
        share = sum((d / 20000) / (1 + d / 20000) for d in range(start, start + 5000)) / 5000
        observed = [window.count(0), window.count(1)]
        assert chi_square(observed, [1 - share, share]) < CHI2_CRITICAL_P001_1DOF, (start, observed)


def only_first_then_only_second(drawn: int) -> list[float]:
    """A plain schedule function: source 0 alone for the first 40 draws, then source 1."""
    return [1.0, 0.0] if drawn < 40 else [0.0, 1.0]


def test_a_plain_function_is_a_schedule():
    mix = wdsx.Mix(endless_pair(), only_first_then_only_second, stop="never")
    drawn = list(itertools.islice(iter(mix), 100))
    assert drawn == [0] * 40 + [1] * 60


def tagged(shards) -> wdsx.DataPipeline:
    """A source whose items say which shard and sample they are."""
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, manifest=False).shuffle(5)
    return dataset.to_tuple("__url__", "__key__").map_tuple(str, str).map(lambda t: t[0] + "|" + t[1])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return [
        make_shards(str(tmp_path_factory.mktemp("first")), [30, 30, 30, 30]),
        make_shards(str(tmp_path_factory.mktemp("second")), [10, 10, 10]),
    ]


def mixture(pair, schedule, stop: str = "all") -> wdsx.DataPipeline:
    return wdsx.Mix([tagged(s) for s in pair], schedule, stop=stop, seed=4).batched(2, collation_fn=None)


@pytest.mark.parametrize(
    "schedule",
    [wdsx.PiecewiseConstant([(0, [3, 1]), (37, [1, 3])]), wdsx.PiecewiseLinear([(0, [1, 0]), (80, [1, 4])])],
    ids=["constant", "linear"],
)
def test_a_scheduled_mixture_resumes_exactly(pair, schedule):
    report = wdsx.check_resume(lambda: mixture(pair, schedule), cuts=4)
    assert report.identical, str(report)


@pytest.mark.slow  # worker processes
def test_a_scheduled_mixture_in_a_loader_resumes_exactly(pair):
    schedule = wdsx.PiecewiseConstant([(0, [3, 1]), (37, [1, 3])])
    report = wdsx.check_resume(
        lambda: wdsx.WebLoader(mixture(pair, schedule), batch_size=None, num_workers=2), cuts=2
    )
    assert report.identical, str(report)


def source_of(item: str, pair) -> int:
    return 0 if item.startswith(pair[0].directory) else 1


def cut_and_re_deal(pair, stop: str, after_batches: int | None = None):
    """Batches of a two-worker loader up to a cut after 12, and of a three-worker loader
    resumed from there (up to ``after_batches`` of them)."""
    first = wdsx.WebLoader(mixture(pair, only_first_then_only_second, stop), batch_size=None, num_workers=2)
    before = list(itertools.islice(iter(first), 12))
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = wdsx.WebLoader(mixture(pair, only_first_then_only_second, stop), batch_size=None, num_workers=3)
    resumed.load_state_dict(state)
    after = list(itertools.islice(iter(resumed), after_batches))
    resumed.close()
    return before, after


@pytest.mark.slow  # worker processes
def test_a_re_dealt_scheduled_mixture_reads_every_sample_once(pair):
    before, after = cut_and_re_deal(pair, "all")
    everything = Counter(f"{url}|{key}" for shards in pair for url, key in urls_and_keys(shards))
    assert Counter(item for batch in before + after for item in batch) == everything


@pytest.mark.slow  # worker processes
def test_a_re_dealt_mixture_continues_its_schedule_where_the_job_was(pair):
    """Two workers deliver 12 batches of 2 (24 draws, all from source 0, which alone has
    weight until draw 40); re-dealt to three workers, each continues from 24 draws: 24 + 3 d
    reaches 40 at its 6th draw, so the first 9 batches (3 per worker, in turn) are source 0's
    and the next 3 source 1's. Had the count restarted, source 0 would go on to draw 40.
    (stop="never", so that no worker's share of source 0 runs out first.)"""
    before, after = cut_and_re_deal(pair, "never", after_batches=12)
    assert all(source_of(item, pair) == 0 for batch in before for item in batch)
    assert [source_of(batch[0], pair) for batch in after] == [0] * 9 + [1] * 3


def urls_and_keys(shards):
    for shard, count in enumerate(shards.counts):
        for index in range(count):
            yield shards.urls[shard], f"s{shard:03d}/{index:05d}"
