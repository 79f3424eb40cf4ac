"""Checkpoints written by earlier wdsx versions keep loading and resume exactly.

``fixtures/state_v2.json`` was written by wdsx's state format version 2 (before stage states
were keyed by name): a WebDataset and a WebLoader with two workers, each stopped mid-epoch,
with the batches an uninterrupted run yielded before and after the stop. The shards are made
again here (same names, same contents); the oracle is that recorded uninterrupted run, and an
uninterrupted run of today's code.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.errors import StateError

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "state_v2.json")
EPOCHS = 2


@pytest.fixture
def saved(tmp_path, monkeypatch):
    with open(FIXTURE) as f:
        data = json.load(f)
    monkeypatch.chdir(tmp_path)
    make_shards("shards", data["counts"])
    return data


def dataset(pattern):
    return (
        wdsx.WebDataset(pattern, shardshuffle=True, manifest=False)
        .shuffle(50)
        .to_tuple("__key__", "cls")
        .batched(7)
    )


def loader(pattern, workers):
    batches = wdsx.WebLoader(dataset(pattern), batch_size=None, num_workers=workers)
    return batches.unbatched().shuffle(20).batched(5)


BUILD = {"dataset": lambda pattern: dataset(pattern), "loader_2_workers": lambda pattern: loader(pattern, 2)}


def epochs_from(pipeline, first_epoch: int) -> list[list[list[str]]]:
    """The keys of each batch, epoch by epoch, from ``first_epoch`` to the last."""
    return [[list(batch[0]) for batch in pipeline] for _ in range(first_epoch, EPOCHS)]


@pytest.mark.parametrize("case", sorted(BUILD))
def test_a_version_2_checkpoint_resumes_exactly(saved, case):
    """The epoch it was taken in resumes exactly as that wdsx dealt it (its shares were
    contiguous spans of the shard order, which its reader state implies); later epochs are
    dealt as today's wdsx deals them, the same as in a run of today's code."""
    recorded = saved["cases"][case]
    assert recorded["state"]["version"] == 2
    build = BUILD[case]
    resumed = build(saved["pattern"])
    resumed.load_state_dict(recorded["state"])
    rest, *later = epochs_from(resumed, recorded["epoch"])
    assert rest == recorded["after"][: len(rest)]
    assert later == epochs_from(build(saved["pattern"]), 0)[recorded["epoch"] + 1 :]
    if case == "dataset":  # one reader: both deals give it the whole epoch, in order
        assert rest + sum(later, []) == recorded["after"]


def test_a_version_2_loader_checkpoint_is_re_dealt_to_three_workers(saved):
    recorded = saved["cases"]["loader_2_workers"]
    resumed = loader(saved["pattern"], 3)
    resumed.load_state_dict(recorded["state"])
    rest_of_epoch = [key for batch in resumed for key in batch[0]]
    every_key = [key for batch in recorded["before"] + recorded["after"] for key in batch][
        : sum(saved["counts"])
    ]
    seen_before = [key for batch in recorded["before"] for key in batch]
    assert Counter(seen_before + rest_of_epoch) == Counter(every_key)


def test_a_version_3_checkpoint_keys_stage_states_by_name(saved):
    pipeline = loader(saved["pattern"], 2)
    iterator = iter(pipeline)
    next(iterator)
    state = pipeline.state_dict()
    assert state["version"] == 3
    assert set(state["stages"]) == {"loader", "unbatched", "shuffle", "batched"}
    worker = state["stages"]["loader"]["states"][0]
    assert set(worker["stages"]) == {"reader", "shuffle", "batched"}


def test_an_unknown_version_is_refused_with_the_versions_read(saved):
    state = dict(saved["cases"]["dataset"]["state"], version=1)
    with pytest.raises(StateError, match="reads versions 2 to 3"):
        dataset(saved["pattern"]).load_state_dict(state)
