"""webdataset's YAML dataset specs, directory work queues and shard-spec helpers in wdsx,
compared with webdataset's own on the same specs and directories."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import webdataset.shardlists as web_shardlists

import wdsx
from wdsx import shardlists

SPEC = """\
prefix: {prefix}
datasets:
  - name: web
    shards: web-{{000000..000019}}.tar
    choose: 4
  - name: books
    shards:
      - books-{{0000..0009}}.tar
      - extra-{{0..2}}.tar
    resample: 6
  - shards: plain-{{0..4}}.tar
    buckets: sub
"""


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(prefix=str(tmp_path) + "/"))
    return str(path)


def their_sample(spec, monkeypatch):
    """webdataset 1.0.2 marks MultiShardSample obsolete; 0.2.x ran it as is."""
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    return web_shardlists.MultiShardSample(spec)


@pytest.mark.parametrize("seed", [0, 3, 12345])
def test_multishardsample_epochs_match_webdataset(spec_file, seed, monkeypatch):
    ours, theirs = shardlists.MultiShardSample(spec_file), their_sample(spec_file, monkeypatch)
    ours.set_epoch(seed)
    theirs.set_epoch(seed)
    for _ in range(2):
        mine = list(ours)
        assert mine == list(theirs)
        assert len(mine) == 4 + 6 + 5


def test_multishardsample_reads_the_spec_as_webdataset_does(spec_file, monkeypatch):
    import yaml

    theirs = their_sample(spec_file, monkeypatch)
    with open(spec_file) as stream:
        spec = yaml.safe_load(stream)
    for ours in (shardlists.MultiShardSample(spec_file), shardlists.MultiShardSample(spec)):
        assert ours.sources == [
            shardlists.MSSource(name=s.name, urls=s.urls, perepoch=s.perepoch, resample=s.resample)
            for s in theirs.sources
        ]
    assert isinstance(shardlists.shardspec(spec_file), shardlists.MultiShardSample)
    assert isinstance(wdsx.shardspec(spec_file), wdsx.MultiShardSample)


def test_multishardsample_without_a_seed_takes_every_listed_shard(tmp_path, monkeypatch):
    spec = {"datasets": [{"name": "a", "shards": "a-{0..3}.tar"}, {"shards": ["b-0.tar", "b-1.tar"]}]}
    expected = sorted(item["url"] for item in their_sample(spec, monkeypatch))
    assert sorted(item["url"] for item in shardlists.MultiShardSample(spec)) == expected


def test_multishardsample_feeds_a_pipeline(shards):
    directory = shards.directory + "/"
    spec = {"prefix": directory, "datasets": [{"shards": "shard-{000000..000004}.tar", "choose": 3}]}
    source = shardlists.MultiShardSample(spec)
    source.set_epoch(1)
    keys = [key for (key,) in wdsx.DataPipeline(source, wdsx.tarfile_to_samples(), wdsx.to_tuple("__key__"))]
    assert len(keys) == 60 and set(keys) <= set(shards.keys)


@pytest.mark.parametrize(
    "spec",
    [
        {"datasets": [{"shards": "a-{0..3}.tar", "choose": 5}]},
        {"datasets": [{"shards": "a-{0..3}.tar", "choose": 2, "resample": 2}]},
        {"datasets": [{"shards": "a.tar", "bogus": 1}]},
        {"datasets": [], "unknown": 1},
        {"datasets": [{"shards": "a.tar", "buckets": ["x", "y"]}]},
    ],
)
def test_multishardsample_refuses_what_webdataset_refuses(spec, monkeypatch):
    with pytest.raises((ValueError, AssertionError)):
        their_sample(spec, monkeypatch)
    with pytest.raises(ValueError):
        shardlists.MultiShardSample(spec)


def test_yaml_is_read_safely(tmp_path):
    """A spec cannot construct Python objects: safe_load refuses the tag."""
    import yaml

    path = tmp_path / "evil.yaml"
    path.write_text("datasets: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(yaml.YAMLError):
        shardlists.MultiShardSample(str(path))


def test_expand_and_envlookup_match(monkeypatch):
    monkeypatch.setenv("SHARD_HOME", "/data")
    monkeypatch.setenv("WDS_BUCKET", "b1")
    for text in ("$SHARD_HOME/x-{0..3}.tar", "~/shards", "${SHARD_HOME}", "plain"):
        assert shardlists.expand(text) == web_shardlists.expand(text)
    match = re.search(r"\$\{(\w+)\}", "s3://${BUCKET}/x.tar")
    assert shardlists.envlookup(match) == web_shardlists.envlookup(match) == "b1"
    missing = re.search(r"\$\{(\w+)\}", "${NOT_SET_ANYWHERE}")
    with pytest.raises(KeyError):
        shardlists.envlookup(missing)


def test_expand_source_matches():
    for source in ("a-{0..3}.tar", ["x", "y"]):
        assert shardlists.expand_source(source) == web_shardlists.expand_source(source)
    assert shardlists.expand_source(iter("abcdef"), 4) == web_shardlists.expand_source(iter("abcdef"), 4)
    for expand_source in (shardlists.expand_source, web_shardlists.expand_source):
        with pytest.raises(ValueError):
            expand_source(42)


@pytest.mark.parametrize("name", ["a.tar", "a.tar._123_", "dir/b.tgz", "noext", "x.y.z", "a._12_", "a._x_"])
def test_file_name_helpers_match(name):
    assert shardlists.without_last_extension(name) == web_shardlists.without_last_extension(name)
    assert shardlists.get_pid_from_filename(name) == web_shardlists.get_pid_from_filename(name)


def test_check_pid_is_running_matches():
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(finished.stdout)
    for pid in (os.getpid(), dead):
        assert shardlists.check_pid_is_running(pid) == web_shardlists.check_pid_is_running(pid)


def fill(directory, names):
    os.makedirs(directory, exist_ok=True)
    for age, name in enumerate(names):
        path = os.path.join(directory, name)
        with open(path, "w") as stream:
            stream.write(name)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    return directory + "/"


@pytest.mark.parametrize("mode", ["unlink", "keep", "resample"])
def test_directory_shard_list_matches(tmp_path, mode):
    names = ["c.tar", "a.tar", "b.tar", "notes.txt"]
    runs = {}
    for side, cls in (("ours", shardlists.DirectoryShardList), ("theirs", web_shardlists.DirectoryShardList)):
        path = fill(str(tmp_path / side), names)
        queue = cls(path, pattern="*.tar", poll=None, mode=mode, select="oldest", timeout=5)
        claimed = []
        for item in queue:
            claimed.append(os.path.basename(item["url"]))
            if len(claimed) == 5:
                break
        runs[side] = (claimed, sorted(os.listdir(path)))
    assert runs["ours"] == runs["theirs"]
    assert runs["ours"][0][0] == f"c.tar._{os.getpid()}_"


def test_directory_shard_list_expands_braces(tmp_path):
    path = fill(str(tmp_path / "queue"), ["a.tar", "b.tgz", "c.txt"])
    queue = shardlists.DirectoryShardList(path, poll=None, mode="unlink")
    claimed = sorted(os.path.basename(item["url"]).split("._")[0] for item in queue)
    assert claimed == ["a.tar", "b.tgz"]
