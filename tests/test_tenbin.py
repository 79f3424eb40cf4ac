"""wdsx's tenbin codec against webdataset's: the same bytes, and each reads the other's."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import webdataset
from webdataset import tenbin as theirs

import wdsx
from wdsx.codecs import tenbin as ours

# uint32 is left out: webdataset 1.0.2's dtype table misspells it, so it can neither write nor read it
SHARED_DTYPES = "float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint64".split()


def arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    result = []
    for dtype in SHARED_DTYPES:
        shape = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 4))))
        result.append((rng.standard_normal(shape) * 100).astype(dtype))
    result.append(np.zeros((3, 0, 2), dtype=np.float32))
    return result


@pytest.mark.parametrize("seed", range(3))
def test_same_bytes_as_webdataset(seed):
    data = arrays(seed)
    infos = [f"a{i}" for i in range(len(data))]
    assert ours.encode_buffer(data) == bytes(theirs.encode_buffer(data))
    assert ours.encode_buffer(data, infos=infos) == bytes(theirs.encode_buffer(data, infos=infos))
    stream = io.BytesIO()
    theirs.write(stream, data)
    assert ours.encode_buffer(data) == stream.getvalue()


@pytest.mark.parametrize("seed", range(3))
def test_each_reads_the_other(seed):
    data = arrays(seed)
    for decoded in (
        ours.decode_buffer(bytes(theirs.encode_buffer(data))),
        theirs.decode_buffer(ours.encode_buffer(data)),
    ):
        assert len(decoded) == len(data)
        for got, want in zip(decoded, data):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)
    decoded, infos = ours.decode_buffer(
        bytes(theirs.encode_buffer(data, infos=["x"] * len(data))), infos=True
    )
    assert infos == ["x"] * len(data)


def test_streams_and_files(tmp_path):
    data = arrays(7)
    stream = io.BytesIO()
    ours.write(stream, data)
    stream.seek(0)
    assert [a.tolist() for a in theirs.read(stream)] == [a.tolist() for a in data]
    stream = io.BytesIO()
    theirs.write(stream, data)
    stream.seek(0)
    assert [a.tolist() for a in ours.read(stream, n=2)] == [a.tolist() for a in data[:2]]
    path = str(tmp_path / "arrays.ten")
    ours.save(path, *data)
    assert [a.tolist() for a in theirs.load(path)] == [a.tolist() for a in data]
    with pytest.raises(ValueError, match="should end in .ten"):
        ours.save(str(tmp_path / "arrays.bin"), *data)


def test_ten_fields_cross_the_writers(tmp_path):
    """A .ten field written by either TarWriter decodes alike with either library."""
    data = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2], dtype=np.int64)]
    paths = {}
    for library in (webdataset, wdsx):
        paths[library.__name__] = str(tmp_path / f"{library.__name__}.tar")
        with library.TarWriter(paths[library.__name__]) as sink:
            sink.write({"__key__": "a", "ten": data, "tb": data[0]})
    for reader in (webdataset, wdsx):
        for path in paths.values():
            (sample,) = reader.WebDataset(path, shardshuffle=False).decode()
            assert [a.tolist() for a in sample["ten"]] == [a.tolist() for a in data]
            assert [a.tolist() for a in sample["tb"]] == [data[0].tolist()]
    raw = {name: next(iter(wdsx.WebDataset(path, shardshuffle=False)))["ten"] for name, path in paths.items()}
    assert raw["wdsx"] == raw["webdataset"]


def test_beyond_webdataset():
    """uint32, 0-d, non-contiguous and big-endian arrays, which webdataset 1.0.2 mishandles."""
    data = [
        np.arange(4, dtype=np.uint32),
        np.float64(2.5) * np.ones(()),
        np.arange(12, dtype=np.int16).reshape(3, 4).T,
        np.arange(3, dtype=">i4"),
    ]
    decoded = ours.decode_buffer(ours.encode_buffer(data))
    for got, want in zip(decoded, data):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert decoded[3].dtype == np.dtype("<i4")


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unsupported dtype"):
        ours.encode_buffer([np.array([True])])
    with pytest.raises(ValueError, match="at most 8"):
        ours.encode_buffer([np.zeros(1)], infos=["too long a name"])
    with pytest.raises(ValueError, match="magic"):
        ours.decode_buffer(os.urandom(64))
    with pytest.raises(ValueError, match="past the buffer"):
        ours.decode_buffer(ours.encode_buffer([np.zeros(100)])[:100])
    with pytest.raises(ValueError, match="do not match"):
        ours.decode_buffer(ours.encode_buffer([np.zeros(1)], infos=["a"]), infos=["b"])
