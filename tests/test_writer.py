"""TarWriter / ShardWriter: checked against webdataset 1.0.2 and Python's tarfile as oracles."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import msgpack
import numpy as np
import pytest
import torch
import webdataset as wds
from PIL import Image

from wdsx.errors import EncodingError
from wdsx.read.manifest import Manifest
from wdsx.read.tar import scan_headers
from wdsx.write.tarformat import HeaderMaker, end_of_archive, padding
from wdsx.write.writer import ShardWriter, TarWriter

LONG_DIR = "d" * 60 + "/" + "e" * 70  # 131 chars: fits ustar's prefix + name fields
LONG_KEY = "x" * 300  # fits no ustar field: needs a pax header


def _png(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG")
    return out.getvalue()


def _rich_samples() -> list[dict]:
    rng = np.random.default_rng(0)
    samples = []
    for i, key in enumerate(["plain", f"{LONG_DIR}/k", LONG_KEY, "ünïcødé/ключ", "dir/sub/s"]):
        samples.append(
            {
                "__key__": key,
                "cls": i,
                "txt": f"text {i} ✓",
                "json": {"i": i, "list": [1, 2, 3]},
                "npy": rng.normal(size=(3, i + 1)),
                "msg": {"a": [i, "b"]},
                "pth": torch.arange(i + 2),
                "png": rng.integers(0, 255, (8, 6), dtype=np.uint8),
                "jpg": rng.integers(0, 255, (8, 8, 3), dtype=np.uint8),
                "raw.bin": bytes(rng.integers(0, 255, 700, dtype=np.uint8)),
                "txt.gz": "compressed text",
                "json.gz": [i, i],
                "npy.gz": np.arange(i + 1),
            }
        )
    return samples


def _check_decoded(got: dict, want: dict) -> None:
    """webdataset's .decode("l8") / .decode("rgb8") output against the sample that was written."""
    assert got["cls"] == want["cls"]
    assert got["txt"] == want["txt"]
    assert got["json"] == want["json"]
    np.testing.assert_array_equal(got["npy"], want["npy"])
    assert got["msg"] == want["msg"]
    assert torch.equal(got["pth"], want["pth"])
    np.testing.assert_array_equal(got["png"], want["png"])
    assert got["raw.bin"] == want["raw.bin"]
    assert got["txt.gz"] == want["txt.gz"]
    assert got["json.gz"] == want["json.gz"]
    np.testing.assert_array_equal(got["npy.gz"], want["npy.gz"])


def _webdataset_samples(path: str, *decode: str) -> list[dict]:
    dataset = wds.WebDataset(path, shardshuffle=False).decode(*decode)
    return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in dataset]


@pytest.mark.parametrize("name", ["shard.tar", "shard.tar.gz"])
def test_webdataset_reads_back_what_was_written(tmp_path, name):
    samples = _rich_samples()
    path = str(tmp_path / name)
    with TarWriter(path) as writer:
        for sample in samples:
            writer.write(sample)
    got = _webdataset_samples(path, "l8")
    assert [s["__key__"] for s in got] == [s["__key__"] for s in samples]
    for sample_got, sample in zip(got, samples, strict=True):
        _check_decoded(sample_got, sample)
        expected_jpeg = io.BytesIO()
        Image.fromarray(sample["jpg"]).save(expected_jpeg, format="JPEG", quality=100)
        raw = wds.WebDataset(path, shardshuffle=False)
        assert next(s for s in raw if s["__key__"] == sample["__key__"])["jpg"] == expected_jpeg.getvalue()


def test_tarfile_sees_the_documented_members(tmp_path):
    path = str(tmp_path / "a.tar")
    with TarWriter(path, user="alice", group="staff", mode=0o640) as writer:
        writer.write({"__key__": f"{LONG_DIR}/k", "b": b"2" * 600, "a": b"1"})
        writer.write({"__key__": LONG_KEY, "txt": "x"})
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [f"{LONG_DIR}/k.a", f"{LONG_DIR}/k.b", LONG_KEY + ".txt"]
        assert [tar.extractfile(m).read() for m in members] == [b"1", b"2" * 600, b"x"]
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "alice", "staff", 0o640)
            assert m.isreg()
    assert os.path.getsize(path) % 10240 == 0


def test_plain_names_match_tarfile_ustar_bytes():
    members = [("k.a", b"xyz"), ("k.b", b"q" * 1000), (f"{LONG_DIR}/k.c", b"")]
    expected = io.BytesIO()
    with tarfile.open(fileobj=expected, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = (
                len(data),
                0,
                0o444,
                "bigdata",
                "bigdata",
            )
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    writer = TarWriter(out)
    writer.write({"__key__": "k", "a": b"xyz", "b": b"q" * 1000})
    writer.write({"__key__": f"{LONG_DIR}/k", "c": b""})
    writer.close()
    assert out.getvalue() == expected.getvalue()


def test_same_samples_as_webdataset_writer(tmp_path):
    samples = _rich_samples()
    ours, theirs = str(tmp_path / "ours.tar"), str(tmp_path / "theirs.tar")
    with TarWriter(ours) as writer:
        for sample in samples[:2] + samples[3:]:  # webdataset's ustar writer cannot hold LONG_KEY
            writer.write(sample)
    with wds.TarWriter(theirs) as writer:
        for sample in samples[:2] + samples[3:]:
            writer.write(sample)
    for decode in ("l8", "rgb8"):
        mine, reference = _webdataset_samples(ours, decode), _webdataset_samples(theirs, decode)
        assert len(mine) == len(reference) == 4
        for a, b in zip(mine, reference, strict=True):
            assert a.keys() == b.keys()
            for field in a:
                if isinstance(a[field], (np.ndarray, torch.Tensor)):
                    np.testing.assert_array_equal(np.asarray(a[field]), np.asarray(b[field]))
                else:
                    assert a[field] == b[field], field


_WRITE_SCRIPT = """
import sys, time
import numpy as np
time.time = lambda: 2_000_000_000.0  # a different "now" from the parent's
from wdsx.write.writer import TarWriter
with TarWriter(sys.argv[1]) as w:
    for i in range(20):
        w.write({"__key__": f"s{i}", "npy": np.arange(i), "txt.gz": "t" * i, "json": {"i": i}})
"""


@pytest.mark.slow  # kept out of the fast loop (subprocesses)
@pytest.mark.parametrize("name", ["det.tar", "det.tar.gz"])
def test_output_is_deterministic_across_processes_and_time(tmp_path, name):
    here, there = str(tmp_path / ("a-" + name)), str(tmp_path / ("b-" + name))
    with TarWriter(here) as writer:
        for i in range(20):
            writer.write({"__key__": f"s{i}", "npy": np.arange(i), "txt.gz": "t" * i, "json": {"i": i}})
    subprocess.run([sys.executable, "-c", _WRITE_SCRIPT, there], check=True)
    digest = [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (here, there)]
    assert digest[0] == digest[1]
    if name.endswith(".gz"):
        assert open(here, "rb").read(10)[4:8] == b"\0\0\0\0"  # gzip mtime field
        assert gzip.decompress(open(here, "rb").read())[:3] == b"s0."


def test_exception_inside_with_leaves_nothing(tmp_path):
    path = tmp_path / "out.tar"
    with pytest.raises(RuntimeError), TarWriter(str(path)) as writer:
        writer.write({"__key__": "a", "txt": "x"})
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


_BIG_WRITE_SCRIPT = """
import sys
from wdsx.write.writer import TarWriter
payload = bytes(1 << 20)
with TarWriter(sys.argv[1]) as w:
    for i in range(100000):
        w.write({"__key__": f"s{i:06d}", "bin": payload})
"""


@pytest.mark.slow  # SIGKILL of a writer
def test_hard_kill_while_writing_leaves_no_file_under_the_final_name(tmp_path):
    path = tmp_path / "big.tar"
    process = subprocess.Popen([sys.executable, "-c", _BIG_WRITE_SCRIPT, str(path)])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            partial = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
            if partial and partial[0].stat().st_size > 8 << 20:
                break
            time.sleep(0.02)
        else:
            pytest.fail("the writer never got going")
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert not path.exists()


def test_fields_filtered_and_keys_checked(tmp_path):
    path = str(tmp_path / "m.tar")
    with TarWriter(path, keep_meta=True) as writer:
        writer.write(
            {
                "__key__": "a_b",
                "__meta__": "kept",
                "__url__": "u",
                "__local_path__": "p",
                "__position__": ("u", 0, 0),
                "txt": "x",
            }
        )
        with pytest.raises(EncodingError, match="replace the dots"):
            writer.write({"__key__": "c.d", "txt": "y"})
    with tarfile.open(path) as tar:
        assert tar.getnames() == ["a_b.__meta__", "a_b.txt"]
    with TarWriter(io.BytesIO()) as writer:
        writer.write({"__key__": "k", "__meta__": "dropped", "txt": "x"})
        with pytest.raises(ValueError, match=r"'k'.*'weird'"):
            writer.write({"__key__": "k", "weird": object()})
        with pytest.raises(ValueError, match="__key__"):
            writer.write({"txt": "no key"})


def test_encoder_options(tmp_path):
    out = io.BytesIO()
    with TarWriter(out, encoder=False) as writer:
        writer.write({"__key__": "k", "txt": "as is", "bin": b"\x00"})
        with pytest.raises(ValueError, match="not bytes"):
            writer.write({"__key__": "j", "cls": 3})
    out = io.BytesIO()
    with TarWriter(out, encoder={"cls": lambda v: b"<%d>" % v}) as writer:
        writer.write({"__key__": "k", "cls": 3})
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        assert tar.extractfile("k.cls").read() == b"<3>"


def test_sizes_beyond_ustar_use_pax(tmp_path):
    """An 8 GiB+ member's headers, in a sparse file, as tarfile and wdsx's reader see them."""
    size = (8 << 30) + 5
    header = HeaderMaker(mode=0o444, mtime=0, uname="u", gname="g").member("huge.bin", size)
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as file:
        file.write(header)
        file.seek(len(header) + size + len(padding(size)))
        file.write(end_of_archive(0))
    with tarfile.open(path) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.size) == ("huge.bin", size)
    with open(path, "rb") as file:
        found = [(name, n) for name, _, n in scan_headers(file.read, lambda n: file.seek(n, 1), "sparse")]
    assert found == [("huge.bin", size)]


def _samples(count: int, size_of=lambda i: 100 + 37 * (i % 11)) -> list[dict]:
    return [{"__key__": f"s{i:04d}", "bin": bytes(size_of(i)), "cls": str(i % 3)} for i in range(count)]


def _keys_per_shard(paths: list[str]) -> list[list[str]]:
    result = []
    for path in paths:
        with tarfile.open(path) as tar:
            keys = []
            for name in tar.getnames():
                key = name.split(".", 1)[0]
                if not keys or keys[-1] != key:
                    keys.append(key)
            result.append(keys)
    return result


@pytest.mark.parametrize(("maxcount", "maxsize"), [(7, 1e9), (1000, 2000), (5, 900), (40, 1e9)])
def test_shards_roll_where_webdataset_rolls(tmp_path, maxcount, maxsize):
    samples = _samples(40)
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(
        str(tmp_path / "wds" / "s-%03d.tar"), maxcount=maxcount, maxsize=maxsize, verbose=0
    ) as w:
        for sample in samples:
            w.write(sample)
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=maxcount, maxsize=maxsize) as w:
        for sample in samples:
            w.write(sample)
    theirs = sorted(str(p) for p in (tmp_path / "wds").glob("*.tar"))
    ours = sorted(str(p) for p in tmp_path.glob("*.tar"))
    assert _keys_per_shard(ours) == [k for k in _keys_per_shard(theirs) if k]
    assert all(_keys_per_shard(ours))


def test_no_shard_and_no_manifest_when_nothing_is_written(tmp_path):
    with ShardWriter(str(tmp_path / "s-%03d.tar")):
        pass
    assert list(tmp_path.iterdir()) == []


def test_manifest_matches_the_files(tmp_path):
    posted = []

    def post(fname):
        with tarfile.open(fname) as tar:  # complete when post runs
            posted.append((os.path.basename(fname), len(tar.getnames())))

    with ShardWriter(
        str(tmp_path / "train-%06d.tar"), maxcount=6, post=post, metadata={"classes": ["a"]}
    ) as w:
        for sample in _samples(20):
            w.write(sample)
    manifest = Manifest.from_json((tmp_path / "train.manifest.json").read_text())
    assert manifest.extra == {"classes": ["a"]}
    assert [s.name for s in manifest.shards] == [f"train-{i:06d}.tar" for i in range(4)]
    assert posted == [(s.name, 2 * s.samples) for s in manifest.shards]
    for entry in manifest.shards:
        data = (tmp_path / entry.name).read_bytes()
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
        assert entry.bytes == len(data)
        with tarfile.open(tmp_path / entry.name) as tar:
            assert entry.samples == len({n.split(".")[0] for n in tar.getnames()})
    assert manifest.total_samples == 20
    assert json.loads((tmp_path / "train.manifest.json").read_text())["total_samples"] == 20


def test_opener_hook_and_compression_from_the_name(tmp_path):
    opened = []

    def opener(fname):
        opened.append(os.path.basename(fname))
        return open(fname, "wb")

    with ShardWriter(str(tmp_path / "p-%d.tar.gz"), maxcount=3, opener=opener) as w:
        for sample in _samples(5):
            w.write(sample)
    assert opened == ["p-0.tar.gz", "p-1.tar.gz", "p.manifest.json"]
    with tarfile.open(tmp_path / "p-1.tar.gz", "r:gz") as tar:
        assert tar.getnames() == ["s0003.bin", "s0003.cls", "s0004.bin", "s0004.cls"]
    assert Manifest.from_json((tmp_path / "p.manifest.json").read_text()).total_samples == 5


def test_appending_shards_with_start_shard_keeps_one_manifest_of_them_all(tmp_path):
    """webdataset's way to add shards to a dataset; the manifest then lists every shard in the
    folder with what hashlib and tarfile say of it, and ``wdsx verify`` passes."""
    from wdsx.commands.cli import main

    def run(count: int, start: int) -> None:
        with ShardWriter(str(tmp_path / "p-%06d.tar"), maxcount=5, verbose=0, start_shard=start) as w:
            for i in range(count):
                w.write({"__key__": f"k{start}_{i}", "txt": "v"})

    run(15, 0)
    run(10, 3)
    manifest = Manifest.from_json((tmp_path / "p.manifest.json").read_text())
    files = sorted(p.name for p in tmp_path.glob("p-*.tar"))
    assert [entry.name for entry in manifest.shards] == files == [f"p-{n:06d}.tar" for n in range(5)]
    for entry in manifest.shards:
        data = (tmp_path / entry.name).read_bytes()
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            assert entry.samples == len(archive.getnames())
        assert (entry.sha256, entry.bytes) == (hashlib.sha256(data).hexdigest(), len(data))
    assert main(["verify", str(tmp_path), "--no-images"]) == 0


def test_a_shorter_re_run_does_not_list_the_shards_a_longer_one_left(tmp_path, capsys):
    from wdsx.commands.cli import main

    for tag, count in (("v1", 10), ("v2", 4)):
        with ShardWriter(str(tmp_path / "t-%06d.tar"), maxcount=2, verbose=0) as w:
            for i in range(count):
                w.write({"__key__": f"{tag}_{i}", "txt": tag})
    manifest = Manifest.from_json((tmp_path / "t.manifest.json").read_text())
    assert [entry.name for entry in manifest.shards] == ["t-000000.tar", "t-000001.tar"]
    assert manifest.total_samples == 4
    assert main(["verify", str(tmp_path), "--no-images"]) == 1
    assert "t-000002.tar" in capsys.readouterr().out


def test_an_opener_stream_of_a_jsonl_zst_pattern_is_zstd(tmp_path):
    import zstandard

    from wdsx.write.jsonl import JsonlShardWriter

    with JsonlShardWriter(str(tmp_path / "z-%06d.jsonl.zst"), verbose=0, opener=lambda f: open(f, "wb")) as w:
        w.write({"i": 0})
    data = (tmp_path / "z-000000.jsonl.zst").read_bytes()
    assert zstandard.ZstdDecompressor().decompressobj().decompress(data) == b'{"i":0}\n'


def test_a_tar_writer_of_dash_writes_standard_output(tmp_path):
    """As webdataset's TarWriter (through gopen) does: ``"-"`` is standard output, and no file
    named ``-`` appears."""
    code = "import wdsx\nwith wdsx.TarWriter('-') as w:\n    w.write({'__key__': 'a', 'txt': 'x'})\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        assert [(m.name, archive.extractfile(m).read()) for m in archive] == [("a.txt", b"x")]  # type: ignore[union-attr]
    assert not (tmp_path / "-").exists()


def test_shard_writer_exception_keeps_complete_shards_only(tmp_path):
    with pytest.raises(RuntimeError), ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2) as w:
        for sample in _samples(3):
            w.write(sample)
        raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s-0.tar"]


def test_writes_through_the_sink_interface(tmp_path, monkeypatch):
    """A URL goes through open_shard_sink: what the sink receives is the shard, committed once."""
    from wdsx.write import writer as writer_module

    events = []

    class MemorySink:
        def __init__(self, url, options):
            self.url, self.data = url, io.BytesIO()
            self.write = self.data.write

        def commit(self):
            events.append(("commit", self.url, self.data.getvalue()))

        def abort(self):
            events.append(("abort", self.url, None))

    monkeypatch.setattr(writer_module, "open_shard_sink", MemorySink)
    with ShardWriter("mem://bucket/s-%02d.tar", maxcount=2, manifest=False) as w:
        for sample in _samples(3):
            w.write(sample)
    assert [(kind, url) for kind, url, _ in events] == [
        ("commit", "mem://bucket/s-00.tar"),
        ("commit", "mem://bucket/s-01.tar"),
    ]
    assert _keys_per_shard_from_bytes(events[1][2]) == ["s0002"]
    assert w.shards[1].sha256 == hashlib.sha256(events[1][2]).hexdigest()


def _keys_per_shard_from_bytes(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return sorted({n.split(".")[0] for n in tar.getnames()})


def test_pbm_and_msgpack_encoders():
    out = io.BytesIO()
    image = np.array([[0, 255], [255, 0]], dtype=np.uint8)
    with TarWriter(out) as writer:
        writer.write(
            {"__key__": "k", "pgm": image, "msgpack": {"x": 1}, "ppm": np.zeros((2, 2, 3), np.uint8)}
        )
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        np.testing.assert_array_equal(np.asarray(Image.open(tar.extractfile("k.pgm"))), image)
        assert msgpack.unpackb(tar.extractfile("k.msgpack").read()) == {"x": 1}
        assert Image.open(tar.extractfile("k.ppm")).mode == "RGB"


def test_a_sample_repeating_a_field_of_the_key_just_written_is_refused(tmp_path):
    """Readers take consecutive members of one key for one sample: a next write with that key
    may add fields (webdataset reads them as one sample), not repeat one (webdataset's reader
    fails on it), which is refused. The same key later on, after another, is a second sample."""
    path = str(tmp_path / "dup.tar")
    with TarWriter(path) as writer:
        writer.write({"__key__": "1", "txt": "hello"})
        with pytest.raises(
            EncodingError, match="the sample written just before has the same key and this field"
        ):
            writer.write({"__key__": "1", "txt": "again", "cls": 3})
        writer.write({"__key__": "1", "cls": 1})
        writer.write({"__key__": "2", "txt": "two"})
        writer.write({"__key__": "1", "txt": "later"})
    read = [(s["__key__"], s["txt"], s.get("cls")) for s in wds.WebDataset(path, shardshuffle=False)]
    assert read == [("1", b"hello", b"1"), ("2", b"two", None), ("1", b"later", None)]


def test_the_manifest_counts_samples_as_readers_do(tmp_path):
    """Fields added under the key just written join its sample, and a write with nothing to
    write is no sample: the manifest's counts are what webdataset reads back."""
    pattern = str(tmp_path / "s-%d.tar")
    with ShardWriter(pattern, verbose=0) as sink:
        sink.write({"__key__": "a", "txt": "x"})
        sink.write({"__key__": "a", "cls": 1})
        sink.write({"__key__": "b", "__meta__": "not written"})
        sink.write({"__key__": "c", "txt": "y"})
    read = [s["__key__"] for s in wds.WebDataset(pattern % 0, shardshuffle=False)]
    manifest = Manifest.load(str(tmp_path / "s.manifest.json"))
    assert read == ["a", "c"] and [entry.samples for entry in manifest.shards] == [len(read)]


def test_a_commit_on_a_full_disk_leaves_no_temporary_file(tmp_path):
    from wdsx.errors import SourceError
    from wdsx.sources.local import LocalSink

    sink = LocalSink(str(tmp_path / "a.tar"), str(tmp_path / "a.tar"))
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        os.dup2(full, sink._file.fileno())  # the disk is full from here on
    finally:
        os.close(full)
    sink.write(b"x" * 100)  # buffered, to be flushed at commit
    with pytest.raises(SourceError, match="No space left on device"):
        sink.commit()
    assert os.listdir(tmp_path) == []


def test_a_rerun_removes_only_a_manifest_it_makes_wrong(tmp_path, monkeypatch):
    """A run that appends shards (start_shard) keeps the manifest of the shards before; one
    writing through an opener never touches a local file of the manifest's name."""
    pattern = str(tmp_path / "train-%06d.tar")
    with ShardWriter(pattern, maxcount=2, verbose=0) as sink:
        for i in range(4):
            sink.write({"__key__": f"a{i}", "txt": "x"})
    manifest = (tmp_path / "train.manifest.json").read_bytes()
    with pytest.raises(RuntimeError), ShardWriter(pattern, maxcount=2, start_shard=2, verbose=0) as sink:
        for i in range(3):
            sink.write({"__key__": f"b{i}", "txt": "y"})
        raise RuntimeError("the run fails after its first new shard")
    assert (tmp_path / "train.manifest.json").read_bytes() == manifest
    stored: dict[str, io.BytesIO] = {}

    class Store(io.BytesIO):
        def close(self) -> None:
            stored[self.name] = io.BytesIO(self.getvalue())
            super().close()

    def opener(name: str) -> Store:
        stream = Store()
        stream.name = name
        return stream

    with ShardWriter(pattern, maxcount=2, opener=opener, verbose=0) as sink:
        for i in range(4):
            sink.write({"__key__": f"c{i}", "txt": "z"})
    assert (tmp_path / "train.manifest.json").read_bytes() == manifest  # written to the store
    assert sorted(os.path.basename(name) for name in stored) == [
        "train-000000.tar",
        "train-000001.tar",
        "train.manifest.json",
    ]
