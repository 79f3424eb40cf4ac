"""Checkpoints are checked completely when loaded: a tampered one is refused there with a
StateError, or resumes exactly.

Real checkpoints of small pipelines (a shuffled, batched WebDataset; a WebLoader; a Mix) are
tampered with by a seeded mutator, then loaded into a fresh pipeline. The oracle is the
uninterrupted run: a state accepted by ``load_state_dict`` must give exactly the batches
that run gave after the checkpoint; anything else must be a StateError raised by
``load_state_dict`` itself (never at iteration time, never another exception type).
"""

from __future__ import annotations

import copy
import json
import zlib
from typing import Any

import pytest

import wdsx
from tests.fixtures.peak import REPORT_PEAK, reported_peak
from tests.fixtures.shards import make_shards
from tests.fuzz.tamper import (
    Case,
    duplicated_positions,
    keys_of,
    loader,
    put,
    standard_cases,
    tamper_many,
    without_digest,
    zlib_bomb,
)
from wdsx.errors import StateError


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    return standard_cases(str(tmp_path_factory.mktemp("validation")))


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> Case:
    urls = make_shards(str(tmp_path_factory.mktemp("workers")), [7, 5, 9, 6]).urls
    return Case("loader-2", lambda: loader(urls, 2), [4], urls)


def test_the_zlib_bomb_is_what_it_claims():
    assert zlib.decompress(zlib_bomb(3)) == bytes(3 << 20)


# --- the fuzz ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_thousand_tampered_checkpoints_are_refused_at_load_or_resume_exactly(cases):
    """States as ``state_dict()`` writes them (with their digest), tampered in every way."""
    tally = tamper_many(list(cases.values()), cases["other"], 1000, seed=25, keep_digest=True)
    assert tally["refused"] > 900


@pytest.mark.slow
def test_tampered_checkpoints_without_a_digest_are_refused_by_their_field_checks(cases):
    """States without a digest (as older wdsx wrote them): every value out of its range or
    of the wrong type, every corrupt or oversized position string, another pipeline's state."""
    tally = tamper_many(list(cases.values()), cases["other"], 1000, seed=4, keep_digest=False)
    assert tally["refused"] > 900


@pytest.mark.slow
def test_tampered_checkpoints_of_a_two_worker_loader_are_refused_in_the_main_process(cases, two_workers):
    tally = tamper_many([two_workers], cases["other"], 30, seed=7, keep_digest=False)
    tally_signed = tamper_many([two_workers], cases["other"], 20, seed=8, keep_digest=True)
    assert tally["refused"] + tally_signed["refused"] > 40


def test_the_untampered_checkpoints_resume_exactly(cases):
    for case in cases.values():
        for state, rest in case.checkpoints:
            assert case.resumed(copy.deepcopy(state)) == rest
            assert case.resumed(without_digest(state)) == rest


# --- one test per reported probe -------------------------------------------------------------
def first_state(cases: dict[str, Case], name: str = "webdataset") -> dict:
    """A copy of the first checkpoint of ``name``, without its digest (so that a field edit
    is caught by the field's own check, as in a state written before digests)."""
    return without_digest(copy.deepcopy(cases[name].checkpoints[0][0]))


def refused(case: Case, state: Any) -> str:
    """The message of the StateError ``load_state_dict`` raises for ``state``."""
    with pytest.raises(StateError) as error:
        case.build().load_state_dict(state)
    return str(error.value)


@pytest.mark.parametrize(
    ("field", "value", "found"),
    [
        ("offset", -5, "found -5 (int)"),  # was OSError: Invalid argument, in a worker
        ("offset", 2**70, "found 1180591620717411303424 (int)"),  # was OverflowError
        ("ordinal", "3", "found '3' (str)"),  # was TypeError
        ("pos", 40, "found 40 (int)"),  # a shard outside the reader's share: other samples
        ("span", 7, "found 7 (int)"),
    ],
)
def test_a_bad_reader_cursor_is_refused_at_load_naming_the_field(cases, field, value, found):
    state = first_state(cases)
    state["stages"]["reader"][field] = value
    message = refused(cases["webdataset"], state)
    assert message.startswith(f"checkpoint field $.stages.reader.{field}: expected ")
    assert message.endswith(found)


def test_a_missing_fingerprint_is_refused_naming_it(cases):
    state = first_state(cases)
    del state["fingerprint"]  # was KeyError: 'fingerprint', in a worker
    assert refused(cases["webdataset"], state) == (
        "checkpoint field $.fingerprint: expected a value, found nothing (the field is missing)"
    )


@pytest.mark.parametrize(("field", "value"), [("passes", -3), ("epoch", -1), ("topology", [3, 2])])
def test_impossible_envelope_counts_are_refused(cases, field, value):
    state = first_state(cases)
    state[field] = value
    assert refused(cases["webdataset"], state).startswith(f"checkpoint field $.{field}: expected ")


def test_a_negative_draw_count_is_refused(cases):
    state = first_state(cases)
    state["stages"]["shuffle"]["draws"] = -4
    assert refused(cases["webdataset"], state) == (
        "checkpoint field $.stages.shuffle.draws: expected an integer >= 0 and below 2**53, found -4 (int)"
    )


def test_a_sample_held_twice_is_refused(cases):
    state = first_state(cases)
    state["stages"]["shuffle"]["positions"] = duplicated_positions(state["stages"]["shuffle"]["positions"])
    assert "held twice" in refused(cases["webdataset"], state)


def test_positions_outside_the_url_table_are_refused(cases):
    from wdsx.state.position import pack_positions

    state = first_state(cases)
    state["stages"]["shuffle"]["positions"] = pack_positions([(len(state["urls"]), 0, 0, 0)])
    assert "missing from its URL table" in refused(cases["webdataset"], state)


@pytest.mark.parametrize("checkpoint", [[], [{"format": "wdsx-state"}], None, "wdsx-state"])
def test_a_checkpoint_that_is_not_an_object_is_refused(cases, checkpoint):
    assert "not a wdsx-state checkpoint" in refused(cases["loader"], checkpoint)


def test_the_digest_refuses_an_edit_no_field_check_can_see(cases):
    state = copy.deepcopy(cases["webdataset"].checkpoints[0][0])
    state["stages"]["reader"]["ordinal"] += 1  # within range: another sample, silently
    assert refused(cases["webdataset"], state).startswith("checkpoint field $.digest: expected sha256:")


def test_another_datasets_state_with_strict_false_warns_and_reads_only_this_dataset(cases):
    """The README's promise: a state of another shard list warns instead of raising. What
    still applies is kept (the epoch, the seed); the other dataset's positions are not read:
    the resumed run is this dataset's epoch from its start."""
    state, _ = cases["other"].checkpoints[0]
    pipeline = cases["webdataset"].build()
    with pytest.warns(UserWarning, match="strict=False: resuming epoch 0"):
        pipeline.load_state_dict(copy.deepcopy(state), strict=False)
    assert keys_of(pipeline) == keys_of(cases["webdataset"].build())


def zlib_bomb_script(directory: str) -> str:
    """A program that loads a checkpoint whose buffer positions inflate to 800 MB and prints
    the error and its time (the caller adds the report of its peak memory)."""
    return f"""
import base64, json, time
import wdsx
from tests.fixtures.shards import make_shards
from tests.fuzz.tamper import zlib_bomb

urls = make_shards({directory!r}, [7, 5]).urls
def build():
    return wdsx.WebDataset(urls, shardshuffle=True, manifest=False).shuffle(6).batched(3)
pipeline = build()
batches = iter(pipeline)
next(batches)
state = pipeline.state_dict()
state.pop("digest")
state["stages"]["shuffle"]["positions"] = "1:11111:" + base64.b64encode(zlib_bomb(800)).decode()
began = time.perf_counter()
try:
    build().load_state_dict(state)
except wdsx.StateError as error:
    print(json.dumps({{"error": str(error), "seconds": time.perf_counter() - began}}))
"""


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_a_zlib_bomb_in_packed_positions_is_refused_quickly_in_bounded_memory(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", REPORT_PEAK + zlib_bomb_script(str(tmp_path / "shards"))],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=True,
    )
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    assert report["error"].startswith(
        "checkpoint field $.stages.shuffle.positions: expected packed positions"
    )
    assert report["seconds"] < 10
    peak = reported_peak(result.stdout)
    assert peak is not None and peak < 500 << 20


def test_a_seed_mismatch_is_found_at_load_not_in_a_worker(two_workers):
    state, _ = two_workers.checkpoints[0]
    with pytest.raises(StateError, match="seed differs: checkpoint has 0, pipeline has 9"):
        loader(two_workers.urls, 2, seed=9).load_state_dict(copy.deepcopy(state))


def test_another_batch_size_in_the_workers_is_refused_naming_the_two_batched_stages(two_workers):
    """The loader's stage describes its whole worker pipeline on one line: the error names the
    part that differs, not two such lines to compare by eye."""
    state, _ = two_workers.checkpoints[0]
    workers = wdsx.WebDataset(two_workers.urls, shardshuffle=True, manifest=False, seed=0).shuffle(6)
    other = wdsx.WebLoader(workers.to_tuple("__key__", "cls").batched(2), batch_size=None, num_workers=2)
    with pytest.raises(StateError) as raised:
        other.unbatched().shuffle(4).batched(4).load_state_dict(copy.deepcopy(state))
    assert str(raised.value).endswith(
        "stage 0 differs (in loader(...)): checkpoint has batched(3, partial=True), "
        "pipeline has batched(2, partial=True)"
    )


def test_strict_false_resumes_a_loader_with_the_checkpoints_seed_without_raising_in_workers(two_workers):
    """The README's promise for another seed: a warning instead of an error; the checkpoint's
    seed is adopted, so the resumed batches are those of the uninterrupted run."""
    state, rest = two_workers.checkpoints[0]
    resumed = loader(two_workers.urls, 2, seed=9)
    with pytest.warns(UserWarning, match="strict=False: resuming epoch 0 with the checkpoint's seed 0"):
        resumed.load_state_dict(copy.deepcopy(state), strict=False)
    assert keys_of(resumed) == rest


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("loader", ("stages", "loader", "states", 0, "stages", "shuffle", "draws")),
        ("mix", ("stages", "mix", "sources", 0, "stages", "shuffle", "draws")),
    ],
)
def test_a_nested_state_is_checked_by_its_own_pipeline_and_named_by_its_full_path(cases, name, path):
    """A worker's state inside a loader's, a source's inside a mixture's: checked at load."""
    state = first_state(cases, name)
    put(state, path, -1)
    where = "$." + ".".join(str(key) for key in path).replace(".0.", "[0].")
    assert refused(cases[name], state).startswith(f"checkpoint field {where}: expected an integer >= 0")
