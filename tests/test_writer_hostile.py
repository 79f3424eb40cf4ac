"""Writers given what they cannot write: hostile keys, field names, values, patterns and a full
disk. Each case ends in a clear error that names the sample and the field, with nothing written
and nothing left behind, or in an exact round trip, read back by webdataset 1.0.2 and by wdsx.
A refusal is checked against an independent oracle too: the same member written by Python's
``tarfile`` and read by webdataset does not come back as written (or the refusal is one of the
documented deliberate ones)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import subprocess
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset as wds
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import wdsx
from wdsx.codecs.encode import EncodingError
from wdsx.read.manifest import Manifest
from wdsx.write.convert import convert
from wdsx.write.jsonl import JsonlShardWriter, JsonlWriter
from wdsx.write.names import MAX_NAME_BYTES, NEVER_WRITTEN
from wdsx.write.writer import ShardWriter, TarWriter

# --- oracles ----------------------------------------------------------------------------------


def _read(module, path) -> list[tuple[str, dict[str, bytes]]]:
    """``(key, fields)`` of every sample ``module`` (webdataset or wdsx) reads from ``path``,
    without the fields readers add."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dataset = module.WebDataset(str(path), shardshuffle=False, empty_check=False)
        return [
            (sample["__key__"], {k: bytes(v) for k, v in sample.items() if k not in NEVER_WRITTEN})
            for sample in dataset
        ]


def _read_back_by_both(path) -> list[tuple[str, dict[str, bytes]]]:
    theirs = _read(wds, path)
    assert _read(wdsx, path) == theirs
    return theirs


def _tarfile_round_trips(key: str, field: str) -> bool:
    """Whether the member ``key.field``, written by Python's tarfile (pax), reads back through
    webdataset as that key and field."""
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(key + "." + field)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"v"))
    except (ValueError, UnicodeError):
        return False
    out.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = list(wds.tariterators.tar_file_expander([{"stream": out, "url": "oracle"}]))
        grouped = list(wds.tariterators.group_by_keys(samples))
    return [(s["__key__"], {k: v for k, v in s.items() if k not in NEVER_WRITTEN}) for s in grouped] == [
        (key, {field: b"v"})
    ]


def _refused_on_purpose(key: str, field: str) -> bool:
    """The refusals documented as deliberate rather than read off the readers: NUL bytes, paths
    that tar tools extract elsewhere, an empty field name, over-long names."""
    name = key + "." + field
    return (
        "\0" in name
        or key.startswith("/")
        or ".." in key.split("/")
        or not field
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
    )


def _leftovers(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


# --- names ------------------------------------------------------------------------------------

KEY, FIELD = "key", "field"  # which name the error blames

REFUSED_NAMES = [
    ("a\0b", "txt", "NUL", KEY),
    ("k", "x\0y", "NUL", FIELD),
    ("k", "a/b", "'/'", FIELD),
    ("k", "seg/../../x", "'/'", FIELD),
    ("/abs/k", "txt", "absolute", KEY),
    ("a/../../k", "txt", "'..'", KEY),
    ("..", "txt", "'..'", KEY),
    (".hidden", "txt", "starts with a dot", KEY),
    ("d/.k", "txt", "starts with a dot", KEY),
    ("a.b/", "txt", "no key and field", FIELD),
    ("d.e\nf/k", "txt", "no key and field", FIELD),
    ("", "txt", "empty", KEY),
    ("k", "", "empty", FIELD),
    ("k", "TXT", "'txt'", FIELD),
    ("k", "seg.PNG", "'seg.png'", FIELD),
    ("__k", "txt__", "metadata", FIELD),
    ("__meta__/k", "txt", "metadata", FIELD),
    ("k\ud800", "txt", "surrogate", KEY),
    ("k", "t\udfff", "surrogate", FIELD),
    ("k" * MAX_NAME_BYTES, "txt", str(MAX_NAME_BYTES), FIELD),
    ("k", "__bad__", "drop", FIELD),
    (5, "txt", "str", KEY),
    (b"k", "txt", "str", KEY),
    (None, "txt", "str", KEY),
    ("k", 5, "str", FIELD),
    ("k", ("a",), "str", FIELD),
]


@pytest.mark.parametrize(("key", "field", "words", "blamed"), REFUSED_NAMES)
def test_a_name_that_would_not_read_back_is_refused_before_any_byte(tmp_path, key, field, words, blamed):
    path = tmp_path / "s.tar"
    writer = TarWriter(str(path), keep_meta=True)
    writer.write({"__key__": "before", "txt": "1"})
    with pytest.raises(EncodingError, match=words) as info:
        writer.write({"__key__": key, field: b"v"})
    assert (info.value.key, info.value.url) == (key, str(path))
    assert info.value.field == (field if blamed == FIELD else None)
    assert str(path) in str(info.value)
    writer.write({"__key__": "after", "txt": "2"})  # the refused sample left no trace
    writer.close()
    assert _read_back_by_both(path) == [("before", {"txt": b"1"}), ("after", {"txt": b"2"})]
    if isinstance(key, str) and isinstance(field, str):
        assert _refused_on_purpose(key, field) or not _tarfile_round_trips(key, field)


@pytest.mark.parametrize(
    "sample",
    [{"txt": "no key"}, ["k", "txt"], None, {"__key__": "k", "txt": "x", 1: "y"}],
    ids=["no-key", "list", "none", "int-field"],
)
def test_what_is_not_a_sample_is_refused(sample):
    out = io.BytesIO()
    with TarWriter(out) as writer, pytest.raises(EncodingError, match="__key__|dict|str"):
        writer.write(sample)
    assert out.getvalue() == bytes(10240)  # an empty archive: nothing of the sample


ACCEPTED_NAMES = [
    ("a\nb", "txt"),
    ("k1", "t\nx"),
    ("caf\udce9/k", "txt"),  # a file name that is not UTF-8, as os.listdir gives it
    ("x" * 300, "txt"),
    ("d" * 60 + "/" + "e" * 70 + "/k", "txt"),
    ("ünïcødé/ключ", "txt"),
    ("a//b", "txt"),
    ("./a", "txt"),
    ("a/", "txt"),
    ("d.e/f", "txt"),
    ("__k__", "txt"),
    ("k2", "_meta"),
    ("k3", "__meta__"),
    ("sp ace", "t x t"),
    ("k4", "output.png"),
    ("k5", "é"),
    ("tab\tand\rreturn", "txt"),
    ("k" * (MAX_NAME_BYTES - 4), "txt"),
]


def test_unusual_names_that_read_back_are_written_exactly(tmp_path):
    path = tmp_path / "s.tar"
    with TarWriter(str(path), keep_meta=True) as writer:
        for number, (key, field) in enumerate(ACCEPTED_NAMES):
            writer.write({"__key__": key, field: b"%d" % number})
    expected = [(key, {field: b"%d" % n}) for n, (key, field) in enumerate(ACCEPTED_NAMES)]
    assert _read_back_by_both(path) == expected
    assert all(_tarfile_round_trips(key, field) for key, field in ACCEPTED_NAMES)


_PIECES = [
    "a",
    "B",
    "é",
    "к",
    ".",
    "..",
    "/",
    "_",
    "__",
    "\n",
    "\0",
    " ",
    "\udce9",
    "\ud800",
    "x" * 120,
    "txt",
]
_NAMES = st.lists(st.sampled_from(_PIECES), max_size=6).map("".join)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=_NAMES, field=_NAMES)
def test_any_key_and_field_is_refused_or_read_back_exactly(tmp_path, key, field):
    assume(field not in NEVER_WRITTEN)
    path = tmp_path / "s.tar"
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    try:
        with TarWriter(str(path), keep_meta=True) as writer:
            writer.write({"__key__": key, field: b"v"})
    except EncodingError:
        assert _leftovers(tmp_path) == []
        assert _refused_on_purpose(key, field) or not _tarfile_round_trips(key, field)
        return
    assert _read_back_by_both(path) == [(key, {field: b"v"})]


def test_a_dotted_key_is_refused_since_readers_split_it(tmp_path):
    """webdataset writes ``a.b`` silently, and both readers give it back as key ``a`` with
    field ``b.txt``; wdsx refuses it and says what to do."""
    assert not _tarfile_round_trips("a.b", "txt")
    with TarWriter(str(tmp_path / "s.tar")) as writer:
        with pytest.raises(EncodingError, match="replace the dots in the key"):
            writer.write({"__key__": "a.b", "txt": "x"})
        writer.write({"__key__": "a_b", "txt": "x"})
    assert _read_back_by_both(tmp_path / "s.tar") == [("a_b", {"txt": b"x"})]


# --- values -----------------------------------------------------------------------------------

REFUSED_VALUES = [
    ("txt", 5, "str or bytes, not int"),
    ("txt", None, "not NoneType"),
    ("txt", ["a"], "not list"),
    ("txt", "\udc80", "surrogate"),
    ("cls", None, "None is not a label"),
    ("npy", None, "None is not an array"),
    ("npy", np.array([{}, 1], dtype=object), "Python objects"),
    ("npz", {"a": np.array([None])}, "Python objects"),
    ("npz", {1: np.zeros(2)}, "names must be str"),
    ("npz", [1], "dict of arrays"),
    ("png", None, "PIL images or numpy arrays"),
    ("png", np.zeros((2, 2), np.float32) + 3, r"\[0, 1\]"),
    ("pyd", lambda: 0, "Pickl"),
    ("json", {"a": {1}}, "set"),
    ("msgpack", object(), "serialize"),
    ("bin", 5, "no encoder for extension 'bin'"),
    ("bin", None, "no encoder"),
]


def _webdataset_fails(field, value) -> bool:
    """Whether webdataset 1.0.2 fails to write ``value`` or to decode what it wrote."""
    out = io.BytesIO()
    try:
        with wds.TarWriter(out) as writer:
            writer.write({"__key__": "k", field: value})
        out.seek(0)
        samples = wds.tariterators.group_by_keys(
            wds.tariterators.tar_file_expander([{"stream": out, "url": "oracle"}])
        )
        decoder = wds.autodecode.Decoder([wds.autodecode.basichandlers])
        for sample in samples:
            decoder(sample)
    except Exception:
        return True
    return False


@pytest.mark.parametrize(("field", "value", "words"), REFUSED_VALUES, ids=lambda v: repr(v)[:20])
def test_a_value_that_cannot_be_encoded_names_sample_and_field(tmp_path, field, value, words):
    path = tmp_path / "s.tar"
    with TarWriter(str(path)) as writer:
        with pytest.raises(EncodingError, match=words) as info:
            writer.write({"__key__": "k", field: value})
        assert (info.value.key, info.value.field, info.value.url) == ("k", field, str(path))
        assert f"sample 'k', field '{field}'" in str(info.value)
        writer.write({"__key__": "next", "txt": "ok"})
    assert _read_back_by_both(path) == [("next", {"txt": b"ok"})]
    assert _webdataset_fails(field, value)


ENCODED_VALUES = [
    ("cls", 5, 5),
    ("cls", np.int64(3), 3),
    ("txt", b"raw", "raw"),
    ("json", [None], [None]),
    ("json", {"a": [1, None]}, {"a": [1, None]}),
    ("pyd", {"a": None}, {"a": None}),
    ("npy", [1, 2], np.array([1, 2])),
    ("npy", torch.arange(3), np.arange(3)),
    ("bin", memoryview(b"ab"), b"ab"),
    ("bin", bytearray(b"cd"), b"cd"),
]


def test_values_the_table_takes_decode_to_what_was_given_with_webdataset(tmp_path):
    path = tmp_path / "s.tar"
    with TarWriter(str(path)) as writer:
        for number, (field, value, _) in enumerate(ENCODED_VALUES):
            writer.write({"__key__": f"s{number}", field: value})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decoded = list(wds.WebDataset(str(path), shardshuffle=False).decode())
    for sample, (field, _, expected) in zip(decoded, ENCODED_VALUES, strict=True):
        assert type(sample[field]) is type(expected)
        np.testing.assert_equal(sample[field], expected)


def test_a_custom_encoder_s_names_are_checked_and_its_errors_are_its_own():
    out = io.BytesIO()
    with TarWriter(out, encoder=lambda s: {"__key__": s["__key__"], "Upper": b"x"}) as writer:
        with pytest.raises(EncodingError, match="'upper'"):
            writer.write({"__key__": "k"})
    with TarWriter(io.BytesIO(), encoder=False) as writer:
        with pytest.raises(EncodingError, match="not bytes"):
            writer.write({"__key__": "k", "cls": 3})


def test_the_error_pickles_with_what_it_names():
    error = EncodingError("why", object(), 5, "s3://b/s.tar")
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is EncodingError and isinstance(again, ValueError)
    assert (again.reason, again.field, again.url) == ("why", "5", "s3://b/s.tar")
    assert str(again) == str(error) and str(error).startswith("sample <object object at")


# --- JSONL ------------------------------------------------------------------------------------

_JSON_KEYS = st.text(max_size=3) | st.integers(-3, 3) | st.booleans() | st.none() | st.floats(allow_nan=False)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.tuples(inner) | st.dictionaries(_JSON_KEYS, inner, max_size=3)
    ),
    max_leaves=8,
)


def _as_json_reads_it(value):
    if isinstance(value, (list, tuple)):
        return [_as_json_reads_it(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_json_reads_it(v) for k, v in value.items()}
    return value


def _has_non_str_key(value) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _has_non_str_key(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_has_non_str_key(v) for v in value)
    return False


@settings(max_examples=100, deadline=None)
@given(value=_JSON)
def test_a_jsonl_line_reads_back_as_written_or_is_refused(value):
    out = io.BytesIO()
    with JsonlWriter(out) as writer:
        try:
            writer.write(value)
        except EncodingError as exn:
            assert _has_non_str_key(value) and "line 1" in str(exn)
            assert out.getvalue() == b""
            return
    assert not _has_non_str_key(value)
    assert json.loads(out.getvalue()) == _as_json_reads_it(value)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ({"a": [{1: "x"}]}, r"value\['a'\]\[0\] has a int key 1, .* the string '1'"),
        ({None: 1}, "'null'"),
        ({"s": {1, 2}}, "set"),
        ({"t": "\ud800"}, "surrogate"),
        (object(), "object"),
    ],
)
def test_jsonl_refusals_name_the_line_and_the_key_readers_give_it(tmp_path, value, words):
    path = tmp_path / "part-000003.jsonl"
    with JsonlWriter(str(path)) as writer:
        writer.write({"first": 1})
        with pytest.raises(EncodingError, match=words) as info:
            writer.write(value)
        assert info.value.key == "part-000003/1" and "line 2" in str(info.value)
        writer.write({"last": 2})
    assert [s["json"] for s in wdsx.WebDataset(str(path), shardshuffle=False)] == [{"first": 1}, {"last": 2}]


def test_a_cycle_is_refused():
    cycle: list = []
    cycle.append(cycle)
    with JsonlWriter(io.BytesIO()) as writer, pytest.raises(EncodingError, match="Circular"):
        writer.write(cycle)


# --- patterns ---------------------------------------------------------------------------------

BAD_PATTERNS = [
    "out.tar",
    "out-%d-%d.tar",
    "out-%(n)d.tar",
    "out-%q.tar",
    "out-100%",
    "out-%%.tar",
    "out-%.0s.tar",
    "out-%c.tar",
    "out-{}.tar",
    "out-%*d.tar",
    5,
    None,
]


@pytest.mark.parametrize("writer_type", [ShardWriter, JsonlShardWriter])
@pytest.mark.parametrize("pattern", BAD_PATTERNS, ids=repr)
def test_a_bad_pattern_is_refused_at_construction(tmp_path, writer_type, pattern):
    target = pattern if not isinstance(pattern, str) else str(tmp_path / pattern)
    with pytest.raises(ValueError, match="%d-style placeholder") as info:
        writer_type(target)
    assert repr(target) in str(info.value)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("pattern", ["out-%06d.tar", "out-%s.tar", "out-%x.tar", "sub/%d.tar"])
def test_good_patterns_name_each_shard(tmp_path, pattern):
    with ShardWriter(tmp_path / pattern, maxcount=1, start_shard=9) as writer:
        for number in range(2):
            writer.write({"__key__": f"s{number}", "txt": "x"})
    assert [entry.name for entry in writer.shards] == [os.path.basename(pattern % n) for n in (9, 10)]
    assert all((tmp_path / (pattern % n)).exists() for n in (9, 10))


def test_convert_checks_its_pattern_first(tmp_path):
    with pytest.raises(ValueError, match="%d-style placeholder"):
        convert(str(tmp_path), str(tmp_path / "out-%d-%d.tar"))


def test_convert_skips_an_image_whose_key_readers_would_skip(tmp_path):
    from PIL import Image

    for folder in ("__cache__", "ok"):
        (tmp_path / "src" / folder).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / "src" / folder / "a.png")
    report = convert(str(tmp_path / "src"), str(tmp_path / "out" / "s"))
    assert [path for path, _ in report.skipped] == ["__cache__/a.png"]
    assert "metadata" in report.skipped[0][1]
    shard = tmp_path / "out" / "s-000000.tar"
    assert [key for key, _ in _read_back_by_both(shard)] == ["ok/a"]


# --- refused samples inside a ShardWriter -----------------------------------------------------


def test_a_shard_whose_samples_were_all_refused_is_not_written(tmp_path):
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=1) as writer:
        writer.write({"__key__": "a", "txt": "1"})
        with pytest.raises(EncodingError):
            writer.write({"__key__": "b", "txt": None})  # opened shard 1, refused
        writer.finish()
        writer.write({"__key__": "c", "txt": "3"})
    assert _leftovers(tmp_path) == ["s-0.tar", "s-1.tar", "s.manifest.json"]
    assert _read_back_by_both(tmp_path / "s-1.tar") == [("c", {"txt": b"3"})]
    manifest = Manifest.from_json((tmp_path / "s.manifest.json").read_text())
    assert [(s.name, s.samples) for s in manifest.shards] == [("s-0.tar", 1), ("s-1.tar", 1)]


# --- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def full_disk(monkeypatch):
    """``full_disk(matches)``: the partial files (the temporary files writers write before
    renaming them into place) whose path ``matches`` are on /dev/full from then on, so every
    write that reaches them fails with ENOSPC, as on a full disk, through the real file objects."""
    if not os.path.exists("/dev/full") or not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /dev/full and /proc")
    real_fdopen = os.fdopen

    def install(matches):
        def fdopen(fd, *args, **kwargs):
            path = os.readlink(f"/proc/self/fd/{fd}")
            if path.endswith(".partial") and matches(path):
                full = os.open("/dev/full", os.O_WRONLY)
                os.dup2(full, fd)
                os.close(full)
            return real_fdopen(fd, *args, **kwargs)

        monkeypatch.setattr(os, "fdopen", fdopen)

    return install


BIG = bytes(3 << 20)  # more than the writers buffer: it reaches the disk while being written


def test_full_disk_at_close_leaves_no_shard(tmp_path, full_disk):
    full_disk(lambda path: True)
    with pytest.raises(OSError, match="No space"), TarWriter(str(tmp_path / "s.tar")) as writer:
        writer.write({"__key__": "k", "txt": "small"})
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("writer_type", [TarWriter, JsonlWriter])
def test_full_disk_while_writing_removes_the_file_before_the_error_returns(tmp_path, full_disk, writer_type):
    full_disk(lambda path: True)
    writer = writer_type(str(tmp_path / ("s.tar" if writer_type is TarWriter else "s.jsonl")))
    sample = {"__key__": "k", "bin": BIG} if writer_type is TarWriter else {"text": "x" * len(BIG)}
    with pytest.raises(OSError, match="No space"):
        writer.write(sample)
    assert _leftovers(tmp_path) == []  # without close(): the writer discarded its file itself
    assert writer.closed
    with pytest.raises(ValueError, match="closed"):
        writer.write(sample)
    writer.close()
    assert _leftovers(tmp_path) == []


def test_full_disk_in_a_later_shard_keeps_the_complete_ones_and_writes_no_manifest(tmp_path, full_disk):
    full_disk(lambda path: "s-1.tar" in path)
    writer = ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=1)
    writer.write({"__key__": "a", "bin": BIG})
    with pytest.raises(OSError, match="No space"):
        writer.write({"__key__": "b", "bin": BIG})
    with pytest.raises(ValueError, match="aborted"):
        writer.write({"__key__": "c", "txt": "x"})
    writer.close()
    assert _leftovers(tmp_path) == ["s-0.tar"]
    assert _read_back_by_both(tmp_path / "s-0.tar") == [("a", {"bin": BIG})]


def test_full_disk_for_the_manifest_leaves_no_partial_manifest(tmp_path, full_disk):
    full_disk(lambda path: "manifest" in path)
    with pytest.raises(OSError, match="No space"), ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2) as w:
        for number in range(3):
            w.write({"__key__": f"k{number}", "txt": "x"})
    assert _leftovers(tmp_path) == ["s-0.tar", "s-1.tar"]


@contextlib.contextmanager
def _tiny_filesystem(directory: Path, size: str):
    """A tmpfs of ``size`` mounted at ``directory`` (root only), unmounted afterwards."""
    directory.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_real_full_disk_leaves_complete_shards_only(tmp_path):
    with _tiny_filesystem(tmp_path / "disk", "256k") as disk:
        writer = ShardWriter(str(disk / "s-%d.tar"), maxcount=1)
        written = 0
        with pytest.raises(OSError, match="No space"):
            for number in range(100):
                writer.write({"__key__": f"k{number}", "bin": bytes(40000)})
                written += 1
            writer.close()
        writer.close()
        shards = _leftovers(disk)
        assert 1 <= len(shards) < written <= 100
        assert all(name.endswith(".tar") for name in shards)  # no partial file, no manifest
        for name in shards:
            assert len(_read_back_by_both(disk / name)) == 1
