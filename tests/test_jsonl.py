"""JSONL shards: what wdsx reads equals ``json.loads`` line by line (the oracle), resuming
equals the uninterrupted run, re-dealing reads the rest exactly once, bad lines are errors
that say where (or are skipped alone), and the writer's shards and manifest check out."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import logging
import lzma
import os
import zlib
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.records import make_jsonl_shards, read_jsonl, write_jsonl
from tests.fixtures.trials import EPOCHS, TRIAL_SPACE, resume_trial
from wdsx.read.samples import Cursor
from wdsx.read.shard import ReadSettings, read_piece
from wdsx.sources import SourceOptions
from wdsx.write.jsonl import JsonlShardWriter, JsonlWriter


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Seven plain shards of uneven length."""
    return make_jsonl_shards(str(tmp_path_factory.mktemp("jsonl")), [37, 37, 5, 37, 37, 61, 37])


def values(dataset) -> list:
    return [sample["json"] for sample in dataset]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_samples_equal_json_loads_line_by_line(tmp_path, suffix):
    data = make_jsonl_shards(str(tmp_path), [300, 1, 250], suffix)
    samples = list(wdsx.WebDataset(data.urls, manifest=False))
    assert [s["json"] for s in samples] == [v for url in data.urls for v in read_jsonl(url)]
    assert [s["__key__"] for s in samples] == data.keys
    assert {s["__url__"] for s in samples} == set(data.urls)
    first = samples[301]  # line 0 of the third shard
    assert first["__position__"] == (data.urls[2], 0, 0, False)


@pytest.mark.parametrize(("suffix", "compress"), [(".jsonl.bz2", bz2.compress), (".jsonl.xz", lzma.compress)])
def test_bzip2_and_xz_shards_are_read_by_their_names(tmp_path, suffix, compress):
    lines = [{"i": i, "s": "é" * i} for i in range(50)]
    path = str(tmp_path / f"part{suffix}")
    with open(path, "wb") as stream:
        stream.write(compress("".join(json.dumps(value) + "\n" for value in lines).encode()))
    samples = list(wdsx.WebDataset(path, manifest=False))
    assert [s["json"] for s in samples] == lines
    assert [s["__key__"] for s in samples] == [f"part/{i}" for i in range(50)]


def test_a_line_nested_too_deeply_for_the_parser_is_a_bad_line(tmp_path):
    """json.loads raises RecursionError, not ValueError, on deep nesting (a fuzz finding)."""
    path = str(tmp_path / "deep.jsonl")
    with open(path, "w") as stream:
        stream.write('{"i": 0}\n' + "[" * 100_000 + "]" * 100_000 + '\n{"i": 2}\n')
    with pytest.raises(
        wdsx.ShardError, match=r"deep\.jsonl: line 2 is not valid JSON \(the JSON is nested too deeply"
    ):
        list(wdsx.WebDataset(path, manifest=False))
    kept = wdsx.WebDataset(path, manifest=False, handler=wdsx.ignore_and_continue)
    assert values(kept) == [{"i": 0}, {"i": 2}]


@pytest.mark.slow  # 100,000 lines, twice
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_hundred_thousand_lines_in_ten_shards_equal_the_oracle(tmp_path, suffix):
    data = make_jsonl_shards(str(tmp_path), [10_000] * 10, suffix)
    oracle = [value for url in data.urls for value in read_jsonl(url)]
    assert values(wdsx.WebDataset(data.urls, manifest=False)) == oracle
    shuffled = values(wdsx.WebDataset(data.urls, manifest=False, shardshuffle=True).shuffle(1000))
    assert sorted(map(json.dumps, shuffled)) == sorted(map(json.dumps, oracle))


def test_positions_are_byte_offsets_of_the_lines(small):
    with open(small.urls[0], "rb") as stream:
        content = stream.read()
    for sample in wdsx.WebDataset(small.urls[:1], manifest=False):
        offset = sample["__position__"].offset
        line = content[offset : content.index(b"\n", offset)]
        assert json.loads(line) == sample["json"]


def test_a_last_line_without_newline_is_read(tmp_path):
    path = write_jsonl(str(tmp_path / "a.jsonl"), [{"a": 1}, {"b": 2}], newline_at_end=False)
    assert values(wdsx.WebDataset(path, manifest=False)) == [{"a": 1}, {"b": 2}]
    assert wdsx.WebDataset(path, manifest=False, counts="scan").reader.counts == [2]


def test_a_truncated_last_line_names_the_shard_and_line(tmp_path):
    path = str(tmp_path / "cut.jsonl")
    write_jsonl(path, [{"i": i, "text": "x" * 20} for i in range(5)])
    with open(path, "rb+") as stream:
        size = stream.seek(0, os.SEEK_END)
        stream.truncate(size - 9)
    with pytest.raises(wdsx.ShardError) as caught:
        list(wdsx.WebDataset(path, manifest=False))
    message = str(caught.value)
    assert path in message and "line 5" in message and "truncated" in message
    assert f"byte offset {caught.value.offset}" in message and caught.value.offset > 0


def test_a_bad_line_is_an_error_or_skipped_alone(tmp_path, caplog):
    path = str(tmp_path / "bad.jsonl")
    with open(path, "w") as stream:
        stream.write('{"i": 0}\n{"i": 1}\n{"i": 2, oops}\n\n{"i": 4}\n')
    with pytest.raises(wdsx.ShardError, match=r"bad\.jsonl: line 3 is not valid JSON .*at byte offset 18"):
        list(wdsx.WebDataset(path, manifest=False))
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        kept = list(wdsx.WebDataset(path, manifest=False, handler=wdsx.warn_and_continue))
    assert [s["json"] for s in kept] == [{"i": 0}, {"i": 1}, {"i": 4}]
    assert [s["__key__"] for s in kept] == ["bad/0", "bad/1", "bad/4"]
    assert sum("line 3" in r.message for r in caplog.records) == 1
    assert sum("line 4 is empty" in r.message for r in caplog.records) == 1
    stopped = list(wdsx.WebDataset([path, path], manifest=False, handler=wdsx.ignore_and_stop))
    assert [s["json"] for s in stopped] == [{"i": 0}, {"i": 1}]


def test_a_shard_shorter_than_its_manifest_says_is_an_error(small):
    counts = list(small.counts)
    counts[2] += 1
    with pytest.raises(wdsx.ShardError, match="ends after 5 lines"):
        list(wdsx.WebDataset(small.urls, counts=counts))


def test_a_shard_longer_than_its_manifest_says_is_an_error(small):
    counts = list(small.counts)
    counts[2] -= 1
    with open(small.urls[2], "rb") as stream:
        extra_line_offset = sum(len(line) for line in stream.readlines()[: counts[2]])
    with pytest.raises(wdsx.ShardError, match=f"more than {counts[2]} lines") as raised:
        list(wdsx.WebDataset(small.urls, counts=counts))
    assert raised.value.url == small.urls[2] and raised.value.offset == extra_line_offset


def test_counts_come_from_a_scan_and_a_manifest(small, tmp_path):
    assert wdsx.WebDataset(small.urls, manifest=False, counts="scan").reader.counts == small.counts
    with JsonlShardWriter(str(tmp_path / "part-%04d.jsonl"), maxcount=40) as sink:
        for value in range(100):
            sink.write({"value": value})
    assert wdsx.WebDataset(str(tmp_path / "part-{0000..0002}.jsonl")).reader.counts == [40, 40, 20]


def test_a_plain_shard_resumes_by_seeking(small):
    """A cursor deep in a plain shard opens the file at its offset: the sample read first is the
    one there (an offset not at a line start would give a line's tail, which is not JSON)."""
    settings = ReadSettings(SourceOptions())
    samples = list(read_piece(small.urls[5], Cursor(0, 0), None, settings))
    deep = samples[50]["__position__"]
    resumed = list(read_piece(small.urls[5], Cursor(deep.offset, deep.ordinal), None, settings))
    assert resumed == samples[50:]
    assert list(read_piece(small.urls[5], Cursor(None, 50), 52, settings)) == samples[50:52]


def test_a_compressed_shard_resumes_by_rereading_logged(tmp_path, caplog):
    data = make_jsonl_shards(str(tmp_path), [30], ".jsonl.gz")
    settings = ReadSettings(SourceOptions())
    samples = list(read_piece(data.urls[0], Cursor(0, 0), None, settings))
    at = samples[20]["__position__"]
    with caplog.at_level(logging.INFO, logger="wdsx"):
        resumed = list(read_piece(data.urls[0], Cursor(at.offset, at.ordinal), None, settings))
    assert resumed == samples[20:]
    assert any("reading it from the start to reach offset" in r.message for r in caplog.records)


def test_a_truncated_compressed_shard_names_how_far_its_lines_were_read(tmp_path):
    lines = b"".join(json.dumps({"n": n, "text": "x" * (n % 50)}).encode() + b"\n" for n in range(2000))
    packed = gzip.compress(lines)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    samples = []
    with pytest.raises(wdsx.ShardError) as raised:
        samples.extend(wdsx.WebDataset(str(path), shardshuffle=False))
    offset = raised.value.offset
    assert offset is not None and "unknown offset" not in str(raised.value)
    # the lines read before the error all lie before that offset of the decompressed bytes
    assert 0 < len(samples) and lines[:offset].count(b"\n") >= len(samples)
    assert offset <= len(zlib.decompressobj(31).decompress(packed[: len(packed) // 2]))


def build(urls, shardshuffle, bufsize, batch, workers, main_stages):
    dataset = wdsx.WebDataset(urls, shardshuffle=shardshuffle, manifest=False).shuffle(bufsize)
    dataset = dataset.to_tuple("__key__").batched(batch)
    if workers is None:
        return dataset
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
    if main_stages:
        loader = loader.unbatched().shuffle(main_stages[0]).batched(main_stages[1])
    return loader


@pytest.mark.parametrize("workers", [None, 0, 2])
def test_resume_equals_the_uninterrupted_run(small, workers):
    full = resume_trial(lambda: build(small.urls, True, 20, 7, workers, (9, 4) if workers else None), 0.37)
    assert sorted(k for b in full for k in b) == sorted(small.keys * EPOCHS)


def test_resume_of_compressed_shards_equals_the_uninterrupted_run(tmp_path):
    data = make_jsonl_shards(str(tmp_path), [23, 41, 9], ".jsonl.gz")
    resume_trial(lambda: build(data.urls, True, 10, 4, 2, (7, 3)), 0.6)


@pytest.mark.slow  # 30 kill/resume trials with worker processes
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shardshuffle=st.booleans(), **TRIAL_SPACE)
def test_kill_and_resume_trials(small, workers, shardshuffle, bufsize, batch, main_stages, cut):
    resume_trial(
        lambda: build(small.urls, shardshuffle, bufsize, batch, workers, main_stages if workers else None),
        cut,
    )


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (0, 2)])
def test_elastic_resume_reads_the_rest_exactly_once(small, old, new):
    def loader(workers):
        dataset = wdsx.WebDataset(small.urls, shardshuffle=True, counts="scan").shuffle(15)
        dataset = dataset.to_tuple("__key__").batched(4)
        return (
            wdsx.WebLoader(dataset, batch_size=None, num_workers=workers).unbatched().shuffle(10).batched(5)
        )

    first = loader(old)
    iterator = iter(first)
    before = [key for _ in range(11) for key in next(iterator)[0]]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    first.close()
    second = loader(new)
    second.load_state_dict(state)
    after = [key for batch in second for key in batch[0]]
    assert Counter(before + after) == Counter(small.keys)


def test_ranks_share_the_epoch_and_resume_elastically(small, monkeypatch):
    def loader():
        dataset = wdsx.WebDataset(small.urls, shardshuffle=True, counts="scan", remainder="exact")
        return wdsx.WebLoader(dataset.to_tuple("__key__").batched(3), batch_size=None, num_workers=0)

    everything, states, consumed = [], [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        everything += [key for batch in loader() for key in batch[0]]
        ranked = iter(partial := loader())
        consumed += [key for _ in range(4) for key in next(ranked)[0]]
        states.append(json.loads(json.dumps(partial.state_dict())))
    assert Counter(everything) == Counter(small.keys)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = loader()
    resumed.load_state_dict({"format": "wdsx-global-state", "version": 1, "ranks": states})
    assert Counter(consumed + [key for batch in resumed for key in batch[0]]) == Counter(small.keys)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_the_writer_writes_shards_and_a_manifest(tmp_path, suffix):
    records = [{"i": i, "text": "é" * (i % 7), "nested": [i, None, True]} for i in range(250)]
    pattern = str(tmp_path / f"out-%03d{suffix}")
    with JsonlShardWriter(pattern, maxcount=100) as sink:
        for record in records:
            sink.write(record)
    paths = [pattern % n for n in range(3)]
    assert [v for path in paths for v in read_jsonl(path)] == records
    manifest = wdsx.Manifest.load(str(tmp_path / "out.manifest.json"))
    assert [entry.samples for entry in manifest.shards] == [100, 100, 50]
    for entry, path in zip(manifest.shards, paths):
        with open(path, "rb") as stream:
            content = stream.read()
        assert (entry.name, entry.bytes, entry.sha256) == (
            os.path.basename(path),
            len(content),
            hashlib.sha256(content).hexdigest(),
        )
    urls = str(tmp_path / f"out-{{000..002}}{suffix}")
    assert values(wdsx.WebDataset(urls)) == records


def test_the_writer_is_atomic_and_deterministic(tmp_path):
    path = str(tmp_path / "one.jsonl.gz")
    with pytest.raises(RuntimeError):
        with JsonlWriter(path) as writer:
            writer.write({"a": 1})
            raise RuntimeError("crash")
    assert not os.path.exists(path)
    for name in ("a.jsonl.gz", "b.jsonl.gz"):
        with JsonlWriter(str(tmp_path / name)) as writer:
            writer.write({"a": [1, 2]})
    with open(tmp_path / "a.jsonl.gz", "rb") as a, open(tmp_path / "b.jsonl.gz", "rb") as b:
        assert a.read() == b.read()
    assert gzip.decompress((tmp_path / "a.jsonl.gz").read_bytes()) == b'{"a":[1,2]}\n'


def test_a_remote_plain_shard_resumes_with_a_ranged_request(small, http_server, fault_proxy):
    with open(small.urls[5], "rb") as stream:
        http_server.add("resume-part-0005.jsonl", stream.read())
    proxy = fault_proxy(http_server.port)
    url = f"http://127.0.0.1:{proxy.port}/resume-part-0005.jsonl"
    options = SourceOptions(prefetch=0)
    first = wdsx.WebDataset(url, manifest=False, options=options)
    iterator = iter(first)
    for _ in range(40):
        next(iterator)
    state = json.loads(json.dumps(first.state_dict()))
    expected = next(iterator)
    offset = state["stages"]["reader"]["offset"]
    assert offset == expected["__position__"].offset > 0
    before = len(proxy.gets("resume-part"))
    resumed = wdsx.WebDataset(url, manifest=False, options=options)
    resumed.load_state_dict(state)
    assert next(iter(resumed))["json"] == expected["json"]
    assert [r.range for r in proxy.gets("resume-part")[before:]] == [f"bytes={offset}-"]
