"""Checkpoints tied to their data: a checkpoint records each shard's size (``os.stat`` is the
oracle) and, from a manifest, its SHA-256 (``hashlib`` is the oracle); resuming on a changed
shard set is refused with a message naming the shard and what changed, unless the change is
declared intended; checkpoints without the record still load."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import shutil

import pytest

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.read.manifest import Manifest, ShardEntry


@pytest.fixture
def shards(tmp_path):
    return make_shards(str(tmp_path / "data"), [6, 7, 5, 8])


def build(urls, manifest=False) -> wdsx.DataPipeline:
    dataset = wdsx.WebDataset(list(urls), shardshuffle=True, manifest=manifest).shuffle(4)
    return dataset.to_tuple("__key__", "cls").batched(3, collation_fn=None)


def checkpoint(pipeline, batches: int = 2) -> dict:
    stream = iter(pipeline)
    list(itertools.islice(stream, batches))
    return json.loads(json.dumps(pipeline.state_dict()))


def sha256_of(path: str) -> str:
    with open(path, "rb") as file:
        return hashlib.sha256(file.read()).hexdigest()


def manifest_of(shards, counts) -> Manifest:
    return Manifest(
        [
            ShardEntry(os.path.basename(url), count, os.path.getsize(url), sha256_of(url))
            for url, count in zip(shards.urls, counts)
        ]
    )


def test_a_checkpoint_records_every_shards_size(shards):
    state = checkpoint(build(shards.urls))
    assert state["data"] == {"shards": [[url, os.path.getsize(url), None] for url in shards.urls]}


def test_a_checkpoint_records_the_manifests_hashes(shards):
    state = checkpoint(build(shards.urls, manifest_of(shards, shards.counts)))
    assert state["data"]["shards"] == [[url, os.path.getsize(url), sha256_of(url)] for url in shards.urls]


def test_the_same_data_resumes(shards):
    full = list(build(shards.urls))
    state = checkpoint(build(shards.urls))
    resumed = build(shards.urls)
    resumed.load_state_dict(state)
    assert list(resumed) == full[2:]


def test_a_removed_shard_is_named(shards):
    state = checkpoint(build(shards.urls))
    with pytest.raises(wdsx.StateError, match=f"shard {shards.urls[2]} removed"):
        build(shards.urls[:2] + shards.urls[3:]).load_state_dict(state)


def test_an_added_shard_is_named(shards, tmp_path):
    state = checkpoint(build(shards.urls[:3]))
    with pytest.raises(wdsx.StateError, match=f"shard {shards.urls[3]} added"):
        build(shards.urls).load_state_dict(state)


def test_a_resized_shard_is_named(shards, tmp_path):
    state = checkpoint(build(shards.urls))
    size = os.path.getsize(shards.urls[1])
    make_shards(str(tmp_path / "other"), [6, 40])  # shard 1 rewritten with more samples
    shutil.copy(str(tmp_path / "other" / "shard-000001.tar"), shards.urls[1])
    grown = os.path.getsize(shards.urls[1])
    assert grown != size
    pattern = f"shard {shards.urls[1]} resized \\({size} bytes in the checkpoint, {grown} now\\)"
    with pytest.raises(wdsx.StateError, match=pattern) as refused:
        build(shards.urls).load_state_dict(state)
    assert 'data_changed="allow"' in str(refused.value)


def test_a_shard_with_other_content_of_the_same_size_is_named(shards):
    state = checkpoint(build(shards.urls, manifest_of(shards, shards.counts)))
    with open(shards.urls[3], "r+b") as file:
        content = file.read()
        file.seek(content.index(b"s003/00004") + 10)  # the first padding byte of that sample
        file.write(b",")
    with pytest.raises(wdsx.StateError, match=f"shard {shards.urls[3]} has other content"):
        build(shards.urls, manifest_of(shards, shards.counts)).load_state_dict(state)


def test_an_intended_change_is_allowed_and_logged(shards, tmp_path, caplog):
    state = checkpoint(build(shards.urls), batches=1)
    make_shards(str(tmp_path / "other"), [6, 7, 5, 40])
    shutil.copy(str(tmp_path / "other" / "shard-000003.tar"), shards.urls[3])
    resumed = build(shards.urls)
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        resumed.load_state_dict(state, data_changed="allow")
    assert f"shard {shards.urls[3]} resized" in caplog.text
    assert json.loads(json.dumps(resumed.state_dict()))["data"]["shards"][3][1] == os.path.getsize(
        shards.urls[3]
    )


def test_an_unknown_choice_is_refused(shards):
    state = checkpoint(build(shards.urls))
    with pytest.raises(ValueError, match="data_changed"):
        build(shards.urls).load_state_dict(state, data_changed="maybe")


def test_a_checkpoint_without_the_record_still_loads(shards):
    """As written before the record existed (and without a digest, which would cover it)."""
    full = list(build(shards.urls))
    state = checkpoint(build(shards.urls))
    old = {key: value for key, value in state.items() if key not in ("data", "digest")}
    resumed = build(shards.urls)
    resumed.load_state_dict(old)
    assert list(resumed) == full[2:]


def test_a_malformed_record_is_refused_naming_the_field(shards):
    state = checkpoint(build(shards.urls))
    state = {key: value for key, value in state.items() if key != "digest"}
    state["data"]["shards"][1] = ["x.tar", -4, None]
    with pytest.raises(wdsx.StateError, match=r"\$\.data\.shards\[1\]"):
        build(shards.urls).load_state_dict(state)


def test_a_mixture_records_every_sources_shards(shards, tmp_path):
    others = make_shards(str(tmp_path / "others"), [4, 4])
    mix = wdsx.Mix([build(shards.urls), build(others.urls)], seed=1)
    state = checkpoint(mix)
    assert [url for url, _, _ in state["data"]["shards"]] == shards.urls + others.urls
    with pytest.raises(wdsx.StateError, match=f"shard {others.urls[1]} removed"):
        wdsx.Mix([build(shards.urls), build(others.urls[:1])], seed=1).load_state_dict(state)


def test_a_loader_checks_its_datasets_shards(shards):
    state = checkpoint(wdsx.WebLoader(build(shards.urls), batch_size=None, num_workers=0))
    changed = wdsx.WebLoader(build(shards.urls[1:]), batch_size=None, num_workers=0)
    with pytest.raises(wdsx.StateError, match=f"shard {shards.urls[0]} removed"):
        changed.load_state_dict(state)
    gathered = {"format": "wdsx-global-state", "version": 3, "ranks": [state]}
    with pytest.raises(wdsx.StateError, match=f"shard {shards.urls[0]} removed"):
        changed.load_state_dict(gathered)
