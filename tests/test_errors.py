"""Bad input: errors name shard, member and offset; continuing handlers lose nothing else."""

from __future__ import annotations

import logging
import tarfile

import pytest

import wdsx
from tests.fixtures.shards import make_shards, sample_key, write_tar


def truncate(path: str, keep: int) -> None:
    with open(path, "r+b") as stream:
        stream.truncate(keep)


def test_truncated_shard_raises_with_url_member_and_offset(tmp_path):
    data = make_shards(str(tmp_path), [10, 10, 10])
    truncate(data.urls[1], 12 * 1024 + 600)  # inside the first member of the seventh sample
    with pytest.raises(wdsx.ShardError) as caught:
        list(wdsx.WebDataset(data.urls, manifest=False))
    error = caught.value
    assert error.url == data.urls[1] and error.member and error.offset is not None
    assert data.urls[1] in str(error) and str(error.offset) in str(error)


def test_warn_and_continue_skips_only_what_is_damaged(tmp_path, caplog):
    data = make_shards(str(tmp_path), [10, 10, 10])
    truncate(data.urls[1], 12 * 1024 + 600)
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        samples = list(wdsx.WebDataset(data.urls, manifest=False, handler=wdsx.warn_and_continue))
    keys = [s["__key__"] for s in samples]
    intact = [k for k in data.keys if not k.startswith("s001/")]
    assert set(intact) <= set(keys)
    damaged_kept = [k for k in keys if k.startswith("s001/")]
    # the six whole samples, then what was read of the seventh (webdataset delivers it too)
    assert damaged_kept == [sample_key(1, i) for i in range(7)]
    assert "txt" not in samples[keys.index(sample_key(1, 6))]
    assert any(data.urls[1] in record.getMessage() for record in caplog.records)


def test_corrupt_header_with_continue_moves_to_the_next_shard(tmp_path):
    data = make_shards(str(tmp_path), [6, 6])
    with open(data.urls[0], "r+b") as stream:
        stream.seek(8 * 512 + 3)  # the header of the third sample's first member
        stream.write(b"\xff\xff")
    keys = [
        s["__key__"] for s in wdsx.WebDataset(data.urls, manifest=False, handler=wdsx.ignore_and_continue)
    ]
    assert keys == [sample_key(0, 0), sample_key(0, 1)] + [sample_key(1, i) for i in range(6)]
    with pytest.raises(wdsx.ShardError, match="checksum"):
        list(wdsx.WebDataset(data.urls, manifest=False))


def test_missing_shard_names_the_url(tmp_path):
    data = make_shards(str(tmp_path), [3])
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(wdsx.SourceError, match="nope.tar"):
        list(wdsx.WebDataset([missing] + data.urls, manifest=False))
    keys = [
        s["__key__"]
        for s in wdsx.WebDataset([missing] + data.urls, manifest=False, handler=wdsx.ignore_and_continue)
    ]
    assert keys == data.keys


def test_decode_failure_names_shard_key_and_field_and_can_be_skipped(tmp_path):
    members = [(f"k{i}.jpg", b"not an image" if i == 2 else open_test_jpeg()) for i in range(4)]
    path = write_tar(str(tmp_path / "images.tar"), members)
    with pytest.raises(wdsx.DecodingError) as caught:
        list(wdsx.WebDataset(path, manifest=False).decode("rgb8"))
    assert caught.value.key == "k2" and caught.value.k == "jpg" and caught.value.url == path
    with tarfile.open(path) as archive:
        start = archive.getmember("k2.jpg").offset  # where tar says the sample's member starts
    assert caught.value.offset == start and f"starts at byte offset {start}" in str(caught.value)
    kept = [
        s["__key__"]
        for s in wdsx.WebDataset(path, manifest=False).decode("rgb8", handler=wdsx.warn_and_continue)
    ]
    assert kept == ["k0", "k1", "k3"]


def open_test_jpeg() -> bytes:
    import io

    import numpy as np
    import PIL.Image

    out = io.BytesIO()
    PIL.Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def test_error_in_user_map_carries_the_sample_identity(tmp_path):
    data = make_shards(str(tmp_path), [3])

    def fail(sample):
        raise RuntimeError("augment failed")

    with pytest.raises(RuntimeError) as caught:
        list(wdsx.WebDataset(data.urls, manifest=False).map(fail))
    assert any(
        sample_key(0, 0) in note and data.urls[0] in note for note in getattr(caught.value, "__notes__", [])
    )


def test_resuming_through_a_stream_that_returns_short_reads(tmp_path, monkeypatch):
    import wdsx.read.shard as reader_module
    from wdsx.read.samples import POSITION
    from wdsx.sources.base import Source

    data = make_shards(str(tmp_path), [10])
    real_open = reader_module.open_source

    class Short(Source):
        def __init__(self, inner):
            self.inner, self.local_path = inner, None

        def read(self, n):
            return self.inner.read(min(n, 100))

        def close(self):
            self.inner.close()

    offsets = [s[POSITION][1] for s in wdsx.WebDataset(data.urls, manifest=False)]
    monkeypatch.setattr(reader_module, "open_source", lambda *a, **k: Short(real_open(*a, **k)))
    dataset = wdsx.WebDataset(data.urls, manifest=False)
    iterator = iter(dataset)
    first = [next(iterator)["__key__"] for _ in range(3)]
    resumed = wdsx.WebDataset(data.urls, manifest=False)
    state = dataset.state_dict()
    assert state["stages"]["reader"]["offset"] == offsets[3]
    resumed.load_state_dict(state)
    assert first + [s["__key__"] for s in resumed] == data.keys


@pytest.mark.parametrize("case", ["missing shard", "duplicate member"])
def test_code_catching_webdatasets_exception_catches_ours(tmp_path, case):
    """Whatever standard exception class webdataset raises for a missing shard and for a field
    twice in a sample (FileNotFoundError, ValueError), an ``except`` of it catches wdsx's."""
    import webdataset

    if case == "missing shard":
        url = str(tmp_path / "absent.tar")
    else:
        url = write_tar(str(tmp_path / "twice.tar"), [("a.txt", b"1"), ("a.txt", b"2")])
    with pytest.raises(Exception) as theirs:
        list(webdataset.WebDataset(url, shardshuffle=False, empty_check=False))
    standard = next(kind for kind in type(theirs.value).__mro__ if kind.__module__ == "builtins")
    assert standard in (FileNotFoundError, ValueError)
    with pytest.raises(standard) as ours:
        list(wdsx.WebDataset(url, shardshuffle=False, manifest=False))
    assert isinstance(ours.value, wdsx.WdsxError) and url in str(ours.value)
