"""Skipping on resume: ``skip(n)`` drops the next n batches, ``skip_keys(keys)`` never delivers
those samples; both are kept in checkpoints. The oracle is always an uninterrupted run computed
separately: a skipped resume must equal it minus the skipped batches or samples, and a resume
of a checkpoint taken after (or before) the skip must continue it exactly."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

import wdsx
from tests.fixtures.shards import make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(str(tmp_path_factory.mktemp("skips")), [13, 21, 8, 17])


def build(shards, buffer: int = 9) -> wdsx.DataPipeline:
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, manifest=False, counts=shards.counts)
    dataset = dataset.shuffle(buffer) if buffer else dataset
    return dataset.to_tuple("__key__", "cls").batched(4, collation_fn=None)


def keys_of(batches) -> list[str]:
    return [key for batch in batches for key, _ in batch]


def saved(pipeline) -> dict:
    """A state as a training script saves it: through JSON."""
    return json.loads(json.dumps(pipeline.state_dict()))


def cut(shards, at: int, buffer: int = 9):
    """The first ``at`` batches of a run and the state after them."""
    first = build(shards, buffer)
    stream = iter(first)
    before = list(itertools.islice(stream, at))
    return before, saved(first)


def resumed(shards, state, buffer: int = 9) -> wdsx.DataPipeline:
    pipeline = build(shards, buffer)
    pipeline.load_state_dict(state)
    return pipeline


@pytest.mark.parametrize("at,n", [(0, 2), (3, 1), (5, 4), (10, 100)])
def test_a_resume_that_skips_batches_gives_the_uninterrupted_run_without_them(shards, at, n):
    full = list(build(shards))
    before, state = cut(shards, at)
    after = list(resumed(shards, state).skip(n))
    assert before == full[:at]
    assert after == full[at + n :]


def test_a_skip_not_yet_done_is_kept_in_the_checkpoint(shards):
    full = list(build(shards))
    _, state = cut(shards, 2)
    skipping = resumed(shards, state).skip(3)
    assert list(resumed(shards, saved(skipping))) == full[5:]


def test_a_checkpoint_taken_after_a_skip_resumes_exactly(shards):
    full = list(build(shards))
    _, state = cut(shards, 2)
    skipping = resumed(shards, state).skip(3)
    stream = iter(skipping)
    taken = list(itertools.islice(stream, 4))
    assert taken == full[5:9]
    assert list(resumed(shards, saved(skipping))) == full[9:]


def test_a_fresh_pipeline_can_skip_its_first_batches(shards):
    assert list(build(shards).skip(2)) == list(build(shards))[2:]


def test_skipping_while_iterating_is_refused(shards):
    pipeline = build(shards)
    next(iter(pipeline))
    with pytest.raises(wdsx.StateError, match="skip"):
        pipeline.skip(1)


@pytest.mark.parametrize("buffer", [0, 9], ids=["in-order", "shuffled"])
def test_skipped_keys_are_never_delivered(shards, buffer):
    skipped = set(shards.keys[::5])
    delivered = keys_of(build(shards, buffer).skip_keys(skipped))
    assert Counter(delivered) == Counter(key for key in shards.keys if key not in skipped)
    if not buffer:  # nothing reorders the samples: the rest keep their order
        assert delivered == [key for key in keys_of(build(shards, 0)) if key not in skipped]


def test_keys_skipped_on_resume_are_dropped_from_the_rest_of_the_run(shards):
    """Without a sample shuffle no buffer holds a sample at a batch boundary, so every key
    not yet delivered is still to be read, and skipping it removes exactly it."""
    full = keys_of(build(shards, 0))
    before, state = cut(shards, 4, buffer=0)
    skipped = set(full[30::3])
    pipeline = resumed(shards, state, buffer=0).skip_keys(skipped)
    stream = iter(pipeline)
    middle = list(itertools.islice(stream, 3))
    later = resumed(shards, saved(pipeline), buffer=0)  # no skip_keys call: the checkpoint has them
    rest = keys_of(middle) + keys_of(later)
    assert keys_of(before) + rest == [key for key in full if key not in skipped]


@pytest.mark.parametrize("skip", ["keys", "batches", "both"])
def test_check_resume_passes_with_skips(shards, skip):
    def make():
        pipeline = build(shards)
        if skip in ("keys", "both"):
            pipeline = pipeline.skip_keys(shards.keys[1::4])
        return pipeline.skip(2) if skip in ("batches", "both") else pipeline

    report = wdsx.check_resume(make, cuts=4, epochs=2)
    assert report.identical, str(report)


def loader(shards, workers: int) -> wdsx.WebLoader:
    return wdsx.WebLoader(build(shards), batch_size=None, num_workers=workers)


def loader_cut(shards, at: int):
    first = loader(shards, 2)
    before = list(itertools.islice(iter(first), at))
    state = saved(first)
    first.close()
    return before, state


@pytest.mark.slow  # worker processes
def test_a_loader_skips_batches_and_keys_exactly(shards):
    full = list(loader(shards, 2))
    before, state = loader_cut(shards, 4)
    skipping = loader(shards, 2)
    skipping.load_state_dict(state)
    assert before + list(skipping.skip(3)) == full[:4] + full[7:]
    skipped = set(shards.keys[::6])
    report = wdsx.check_resume(lambda: loader(shards, 2).skip_keys(skipped), cuts=2)
    assert report.identical, str(report)
    assert not skipped & set(keys_of(loader(shards, 2).skip_keys(skipped)))


@pytest.mark.slow  # worker processes
def test_skips_on_a_re_dealt_loader(shards):
    """Re-dealt from 2 workers to 3: skipping n batches gives the re-dealt run (computed
    separately, without the skip) minus its first n; skipped keys are never delivered and
    every other sample still comes exactly once."""
    before, state = loader_cut(shards, 3)
    plain = loader(shards, 3)
    plain.load_state_dict(state)
    reference = list(plain)
    skipping = loader(shards, 3)
    skipping.load_state_dict(state)
    assert list(skipping.skip(2)) == reference[2:]
    future = set(keys_of(reference[4:]))
    skipped = set(sorted(future)[::3])
    keyed = loader(shards, 3)
    keyed.load_state_dict(state)
    delivered = keys_of(before) + keys_of(keyed.skip_keys(skipped))
    assert Counter(delivered) == Counter(key for key in shards.keys if key not in skipped)


def test_the_length_of_a_pipeline_about_to_skip_leaves_the_skipped_batches_out(shards):
    """The oracle for the length: the batches an uninterrupted run yields, counted."""
    full = list(build(shards, 0))
    _, state = cut(shards, 3, buffer=0)
    pipeline = resumed(shards, state, buffer=0).skip(2)
    assert len(pipeline) == len(full) - 5 == len(list(pipeline))
