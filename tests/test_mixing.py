"""Mixing datasets: proportions, exact resume, elastic resume, and webdataset's RandomMix and
RoundRobin as oracles.

Proportions are checked with a chi-square goodness-of-fit test at p = 0.001 (critical values
from the chi-square table); resumption against an uninterrupted run of the same mixture.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter

import pytest
import webdataset
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.shards import make_shards

CHI2_CRITICAL_P001 = {1: 10.828, 2: 13.816, 4: 18.467}
"""Upper 0.001 quantiles of the chi-square distribution, by degrees of freedom."""


def chi_square(observed: list[int], weights: list[float]) -> float:
    total = sum(observed)
    expected = [total * w / sum(weights) for w in weights]
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected))


def endless_sources(count: int) -> list[wdsx.DataPipeline]:
    """In-memory sources tagged with their index, long enough to rarely restart."""
    return [wdsx.DataPipeline([(k, i) for i in range(1000)]) for k in range(count)]


@pytest.mark.slow
@pytest.mark.parametrize("weights", [[0.7, 0.3], [5, 3, 2], [1, 2, 3, 4, 10]], ids=["2", "3", "5"])
@pytest.mark.parametrize("batch_size", [None, 3], ids=["items", "batches"])
def test_realised_proportions_match_the_weights(weights, batch_size):
    mix = wdsx.Mix(
        endless_sources(len(weights)), weights, stop="never", batch_size=batch_size, collation_fn=None, seed=7
    )
    draws = list(itertools.islice(iter(mix), 100_000))
    sources = [draw[0][0] if batch_size else draw[0] for draw in draws]
    if batch_size:
        assert all({k for k, _ in draw} == {draw[0][0]} and len(draw) == batch_size for draw in draws)
    observed = [sources.count(k) for k in range(len(weights))]
    assert chi_square(observed, weights) < CHI2_CRITICAL_P001[len(weights) - 1]


def shards_for(tmp_path_factory, name: str, counts: list[int]):
    return make_shards(str(tmp_path_factory.mktemp(name)), counts)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    return [
        shards_for(tmp_path_factory, "a", [23, 17, 30]),
        shards_for(tmp_path_factory, "b", [11, 9]),
        shards_for(tmp_path_factory, "c", [40]),
    ]


def tagged(shards, bufsize: int) -> wdsx.DataPipeline:
    """A source whose items name their shard and key, so sources never collide."""
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, manifest=False)
    dataset = dataset.shuffle(bufsize) if bufsize else dataset
    return dataset.to_tuple("__url__", "__key__").map_tuple(str, str).map(lambda t: (t[0] + "|" + t[1],))


def build(sources, weights, stop, batch_size, bufsize, workers, epoch_length):
    mix = wdsx.Mix([tagged(s, bufsize) for s in sources], weights, stop=stop, batch_size=batch_size, seed=3)
    if stop == "never":
        mix = mix.with_epoch(epoch_length)
    batched = mix if batch_size else mix.batched(4)
    if workers is None:
        return batched
    return wdsx.WebLoader(batched, batch_size=None, num_workers=workers)


def keys_of(batch) -> list[str]:
    return list(batch[0])


def run(loader, epochs: int, stop_after: int | None = None):
    seen = []
    for epoch in range(epochs):
        for batch in loader:
            seen.append(keys_of(batch))
            if stop_after is not None and len(seen) == stop_after:
                return seen, epoch, json.loads(json.dumps(loader.state_dict()))
    return seen, epochs, None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    nsources=st.integers(2, 3),
    weights=st.lists(st.integers(1, 5), min_size=3, max_size=3),
    stop=st.sampled_from(["first", "all", "never"]),
    batch_size=st.sampled_from([None, 3]),
    bufsize=st.sampled_from([0, 5, 30]),
    workers=st.sampled_from([None, 0, 1, 2, 3]),
    cut=st.floats(0, 1),
)
@pytest.mark.slow  # kill/resume trials with worker processes
def test_a_mixture_killed_anywhere_resumes_exactly(
    three, nsources, weights, stop, batch_size, bufsize, workers, cut
):
    args = (three[:nsources], weights[:nsources], stop, batch_size, bufsize, workers, 150)
    full, _, _ = run(build(*args), epochs=2)
    stop_at = max(1, int(cut * len(full)))
    first = build(*args)
    before, epoch, state = run(first, 2, stop_after=stop_at)
    first.close()
    resumed = build(*args)
    resumed.load_state_dict(state)
    after, _, _ = run(resumed, 2 - epoch)
    assert before + after == full


@pytest.mark.slow
def test_an_exhausted_source_starts_its_next_epoch_and_resumes_across_it(three):
    """stop="never": the small source ("b", 20 samples) runs out several times in 150 draws;
    each new epoch gives each of its samples again, and a cut inside a later epoch resumes."""
    full, _, _ = run(build(three, [1, 4, 1], "never", None, 5, None, 150), epochs=1)
    small = Counter(key for batch in full for key in batch if key.startswith(three[1].directory))
    assert set(small) == {f"{three[1].directory}/shard-{s:06d}.tar|{k}" for s, k in _keys_by_shard(three[1])}
    assert min(small.values()) >= 2
    for cut in (11, 29):
        first = build(three, [1, 4, 1], "never", None, 5, 2, 150)
        before, _, state = run(first, 1, stop_after=cut)
        first.close()
        resumed = build(three, [1, 4, 1], "never", None, 5, 2, 150)
        resumed.load_state_dict(state)
        assert before + run(resumed, 1)[0] == run(build(three, [1, 4, 1], "never", None, 5, 2, 150), 1)[0]


def _keys_by_shard(shards):
    for shard, count in enumerate(shards.counts):
        for index in range(count):
            yield shard, f"s{shard:03d}/{index:05d}"


def every_key(sources) -> Counter:
    return Counter(f"{url}|{key}" for s in sources for url, key in _urls_and_keys(s))


def _urls_and_keys(shards):
    for shard, key in _keys_by_shard(shards):
        yield shards.urls[shard], key


@pytest.mark.parametrize("workers_before,workers_after", [(2, 3), (3, 1)])
def test_a_mixture_re_dealt_to_other_workers_reads_every_remaining_sample_once(
    three, workers_before, workers_after
):
    args = (three, [3, 1, 2], "all", None, 10)
    first = build(*args, workers_before, 0)
    before, _, state = run(first, 1, stop_after=9)
    first.close()
    resumed = build(*args, workers_after, 0)
    resumed.load_state_dict(state)
    after, _, _ = run(resumed, 1)
    assert Counter(k for b in before + after for k in b) == every_key(three)


@pytest.mark.parametrize("workers_before,workers_after", [(1, 2), (1, 3)])
def test_a_never_ending_mixture_re_dealt_goes_on_in_each_sources_own_epoch(
    three, workers_before, workers_after
):
    """stop="never": by the cut the small source has begun later epochs of its own; after the
    re-deal it must go on from there, so no sample comes twice in one of its epochs (told by
    the epoch seed each sample carries), and the outputs already given stay counted. (Old
    readers whose shares of a source have reached different epochs are refused: StateError.)"""

    def source(shards):
        dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, manifest=False)
        return dataset.to_tuple("__url__", "__key__", "__epoch_seed__")

    def loader(workers):
        mix = wdsx.Mix([source(three[2]), source(three[1])], [1, 1], stop="never", seed=3).batched(4)
        return wdsx.WebLoader(mix, batch_size=None, num_workers=workers, worker_type="thread").with_epoch(40)

    def epoch_seed(epoch):
        pipeline = source(three[1])
        pipeline.set_epoch(epoch)
        return int(next(iter(pipeline))[2])

    epoch_of = {epoch_seed(epoch): epoch for epoch in range(8)}

    def small(batches):
        return [
            (key, epoch_of[int(seed)])
            for urls, keys, seeds in batches
            for url, key, seed in zip(urls, keys, seeds)
            if url.startswith(three[1].directory)
        ]

    first = loader(workers_before)
    iterator = iter(first)
    before = list(itertools.islice(iterator, 15))
    state = json.loads(json.dumps(first.state_dict()))
    given = first.contributions()
    del iterator
    assert max(epoch for _, epoch in small(before)) >= 1  # the small source is past its first epoch
    resumed = loader(workers_after)
    resumed.load_state_dict(state)
    assert resumed.contributions() == given and sum(given) == 4 * len(before)
    delivered = small(before + list(resumed))
    assert max(Counter(delivered).values()) == 1


def test_the_loader_reports_each_sources_contributions(three):
    loader = build(three, [3, 1, 2], "all", None, 0, 2, 0)
    batches = iter(loader)
    seen = [key for _ in range(10) for key in keys_of(next(batches))]
    per_source = [sum(key.startswith(s.directory) for key in seen) for s in three]
    assert loader.contributions() == per_source
    del batches
    loader.close()


@pytest.mark.parametrize("workers", [None, 2])
def test_contributions_after_an_epoch_are_that_epochs(three, workers):
    """Read once the loop is over, as a training script logs it: the epoch just ended, counted
    from the items delivered; the next epoch's first batch starts the count again."""
    loader = build(three, [3, 1, 2], "all", None, 0, workers, 0)
    seen = [key for batch in loader for key in keys_of(batch)]
    assert sum(len(s.keys) for s in three) == len(seen)
    per_source = [sum(key.startswith(s.directory) for key in seen) for s in three]
    contributions = loader.contributions()
    assert contributions == per_source
    batches = iter(loader)
    first = keys_of(next(batches))
    assert loader.contributions() == [sum(key.startswith(s.directory) for key in first) for s in three]
    del batches


def test_round_robin_gives_webdatasets_outputs(three):
    for longest in (False, True):
        ours = list(
            wdsx.RoundRobin([wdsx.WebDataset(s.urls, manifest=False) for s in three], longest=longest)
        )
        theirs = list(
            webdataset.RoundRobin(
                [webdataset.WebDataset(s.urls, shardshuffle=False, empty_check=False) for s in three],
                longest=longest,
            )
        )
        assert [(x["__url__"], x["__key__"]) for x in ours] == [(x["__url__"], x["__key__"]) for x in theirs]


def test_a_round_robin_mix_resumes_exactly_after_every_output(three):
    """Its turn is counted after each output and wraps when the next is chosen: a state
    taken in between can hold the number of sources, which loading must accept."""

    def mix():
        sources = [wdsx.WebDataset(s.urls, manifest=False).to_tuple("__key__") for s in three]
        return wdsx.Mix(sources, order="round_robin")

    whole = [key for (key,) in mix()]
    for cut in range(1, len(whole)):
        first = mix()
        outputs = iter(first)
        before = [next(outputs)[0] for _ in range(cut)]
        resumed = mix()
        resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
        assert before + [key for (key,) in resumed] == whole, cut


def test_random_mix_draws_like_webdatasets():
    """Both libraries' RandomMix over the same endless sources: each matches the weights, and
    their counts are alike (a chi-square test of homogeneity on the 2 x 3 table)."""
    probs = [0.5, 0.3, 0.2]
    ours = list(itertools.islice(iter(wdsx.RandomMix(endless_sources(3), probs)), 30_000))
    random.seed(11)
    theirs_sources = [iter([(k, i) for i in range(30_000)]) for k in range(3)]
    theirs = list(itertools.islice(webdataset.mix.random_samples(theirs_sources, probs), 30_000))
    table = [[sum(1 for k, _ in draws if k == source) for source in range(3)] for draws in (ours, theirs)]
    for row in table:
        assert chi_square(row, probs) < CHI2_CRITICAL_P001[2]
    columns = [a + b for a, b in zip(*table)]
    total = sum(columns)
    statistic = sum(
        (table[r][c] - sum(table[r]) * columns[c] / total) ** 2 / (sum(table[r]) * columns[c] / total)
        for r in range(2)
        for c in range(3)
    )
    assert statistic < CHI2_CRITICAL_P001[2]


def test_random_mix_stops_at_the_first_exhausted_source_unless_longest(three):
    short = list(wdsx.RandomMix([wdsx.WebDataset(s.urls, manifest=False) for s in three[:2]], [1, 1]))
    assert len(short) < sum(three[0].counts) + sum(three[1].counts)
    full = list(
        wdsx.RandomMix([wdsx.WebDataset(s.urls, manifest=False) for s in three[:2]], [1, 1], longest=True)
    )
    assert len(full) == sum(three[0].counts) + sum(three[1].counts)


def test_bad_mixtures_are_refused():
    with pytest.raises(ValueError, match="weights"):
        wdsx.Mix(endless_sources(2), [1, 2, 3])
    with pytest.raises(ValueError, match="stop"):
        wdsx.Mix(endless_sources(2), stop="sometimes")


def test_wdsx_bench_prints_each_sources_share(three, capsys):
    from wdsx.commands import cli

    status = cli.main(["bench", *three[0].urls, "--mix-with", three[2].urls[0], "--batch-size", "10"])
    printed = capsys.readouterr().out
    assert status == 0
    assert f"source 0: {sum(three[0].counts)} samples" in printed
    assert f"source 1: {sum(three[2].counts)} samples" in printed


def test_samples_re_read_into_a_buffer_after_the_mixer_say_their_epoch_is_unknown(three):
    """The resumed run yields the uninterrupted run's samples; those re-read into a buffer after
    the mixer carry no epoch seed (which epoch of its source each was read in is not kept), so
    per-sample randomness drawn on them says so instead of differing silently."""

    def make():
        sources = [wdsx.WebDataset(shards.urls, shardshuffle=True) for shards in three[:2]]
        return wdsx.Mix(sources, [1, 1]).shuffle(20)

    full = [sample["__key__"] for sample in make()]
    dataset = make()
    samples = iter(dataset)
    head = [next(samples)["__key__"] for _ in range(30)]
    resumed = make()
    resumed.load_state_dict(dataset.state_dict())
    rest = list(resumed)
    assert head + [sample["__key__"] for sample in rest] == full
    unknown = [sample for sample in rest if sample["__epoch_seed__"] is None]
    assert 0 < len(unknown) <= 20 < len(rest)  # only what the shuffle buffer held
    with pytest.raises(ValueError, match="epoch cannot be known"):
        wdsx.sample_rng(unknown[0])


def test_a_mix_inside_a_mix_re_dealt_after_a_reader_finished_it_reads_the_rest_once(tmp_path):
    """A reader whose inner mixture is exhausted hands over nothing of it on a re-deal; the
    oracle is the uninterrupted run's samples, each once."""
    x, y, z = (
        make_shards(str(tmp_path / name), sizes)
        for name, sizes in (("x", [10] * 4), ("y", [6, 6]), ("z", [20] * 3))
    )

    def source(shards) -> wdsx.WebDataset:
        return wdsx.WebDataset(shards.urls, shardshuffle=True).to_tuple("__url__", "__key__")

    def loader(workers: int) -> wdsx.WebLoader:
        inner = wdsx.Mix([source(x), source(y)], weights=[1, 1])
        outer = wdsx.Mix([inner, source(z)], weights=[1, 2])
        return wdsx.WebLoader(outer.batched(4), batch_size=None, num_workers=workers, worker_type="thread")

    def samples(batches) -> list[str]:
        return [f"{url}|{key}" for urls, keys in batches for url, key in zip(urls, keys)]

    uninterrupted = samples(loader(2))
    assert Counter(uninterrupted) == every_key([x, y, z])
    for cut, workers in ((24, 3), (27, 1), (len(uninterrupted) // 4, 3)):
        first = loader(2)
        batches = iter(first)
        delivered = samples(itertools.islice(batches, cut))
        state = json.loads(json.dumps(first.state_dict()))
        del batches
        resumed = loader(workers)
        resumed.load_state_dict(state)
        assert Counter(delivered + samples(resumed)) == every_key([x, y, z])


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 1)])
def test_len_of_a_mixture_re_dealt_to_other_workers_is_what_arrives(three, before, after):
    """A mixture (stop="all") whose sources know their sample counts, re-dealt to another
    number of workers: len() counts each source's re-dealt share, the batches that then
    arrive, which with those before are every sample once."""

    def loader(workers: int) -> wdsx.WebLoader:
        sources = [
            wdsx.WebDataset(shards.urls, shardshuffle=True, counts=shards.counts).to_tuple("__key__")
            for shards in three
        ]
        mixture = wdsx.Mix(sources, [3, 1, 2], stop="all", seed=3).batched(4)
        return wdsx.WebLoader(mixture, batch_size=None, num_workers=workers, worker_type="thread")

    first = loader(before)
    batches = iter(first)
    seen = [key for _ in range(9) for key in next(batches)[0]]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = loader(after)
    resumed.load_state_dict(state)
    told = len(resumed)
    rest = [keys for (keys,) in resumed]
    assert told == len(rest)
    assert Counter(seen + [key for keys in rest for key in keys]) == Counter(k for s in three for k in s.keys)
