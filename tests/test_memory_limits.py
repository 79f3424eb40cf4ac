"""The memory policy (``wdsx.core.limits``): every input that once made a read hold memory
without bound now ends, within 10 s and under 500 MB of peak RSS, in a clear error naming the
shard, the member or line and the byte offset (or in the correct result), and a continuing
handler skips just what was refused.

Each hostile input is built here in small pieces (a gzip of 1 MiB of zeros, repeated: gzip
and bzip2 read concatenated streams as one), then read in a fresh Python process whose peak
RSS ``os.wait4`` reports. Ordinary data under the same limits is checked against
independent oracles: ``tarfile``, ``gzip``, ``json.loads`` and webdataset's own decoder.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import textwrap
import time
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import pytest

import wdsx
from tests.fixtures.peak import REPORT_PEAK, reported_peak
from wdsx.core import limits
from wdsx.core.errors import DecodingError, ShardError

PEAK_LIMIT = 500 << 20
TIME_LIMIT = 10.0
HANG_GUARD = 60.0
"""A child still running after this long is killed: a hang, reported as a failure."""
BOMB = 1500 << 20
"""What each bomb inflates to: 1.5 GB, as in the inputs first reported."""
MIB_OF_ZEROS = bytes(1 << 20)

PRELUDE = """
import json, sys, time

def report(action):
    start = time.monotonic()
    outcome = {}
    try:
        outcome["result"] = action()
    except Exception as exn:
        outcome["error"] = type(exn).__name__
        outcome["message"] = str(exn)
        for name in ("url", "offset", "member", "key", "k"):
            value = getattr(exn, name, None)
            if isinstance(value, (str, int)):
                outcome[name] = value
    outcome["seconds"] = time.monotonic() - start
    print("OUTCOME " + json.dumps(outcome))
"""


@dataclass
class Run:
    """What a measured child did: its exit status, its output, its peak RSS, and the outcome
    it reported (the result or the error of its action, and how long the action took)."""

    status: int
    output: str
    peak: int
    outcome: dict[str, Any]


def measured(code: str, *args: str, env: dict[str, str] | None = None) -> Run:
    """Run ``code`` (after :data:`PRELUDE`) in a fresh Python process with ``args``; check that
    it stayed under :data:`PEAK_LIMIT` of peak RSS and that its action took under
    :data:`TIME_LIMIT`."""
    log = io.BytesIO()
    with subprocess.Popen(
        [sys.executable, "-c", REPORT_PEAK + PRELUDE + textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    ) as child:
        assert child.stdout is not None
        os.set_blocking(child.stdout.fileno(), False)
        deadline = time.monotonic() + HANG_GUARD
        while True:
            log.write(child.stdout.read() or b"")
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                pytest.fail(f"the child did not finish within {HANG_GUARD} s")
            time.sleep(0.05)
        child.returncode = os.waitstatus_to_exitcode(status)
        log.write(child.stdout.read() or b"")
    output = log.getvalue().decode("utf-8", "replace")
    reports = [line for line in output.splitlines() if line.startswith("OUTCOME ")]
    outcome = json.loads(reports[-1][len("OUTCOME ") :]) if reports else {}
    run = Run(child.returncode, output, reported_peak(output) or usage.ru_maxrss * 1024, outcome)
    assert run.peak < PEAK_LIMIT, f"peak RSS {run.peak >> 20} MiB\n{output[-2000:]}"
    assert outcome.get("seconds", 0) < TIME_LIMIT, output[-2000:]
    return run


ITERATE = """
import wdsx
report(lambda: [s["__key__"] for s in wdsx.WebDataset(sys.argv[1:], shardshuffle=False, empty_check=False)])
"""
ITERATE_ON = """
import wdsx
report(lambda: [
    s["__key__"]
    for s in wdsx.WebDataset(sys.argv[1:], shardshuffle=False, handler=wdsx.warn_and_continue)
])
"""
DECODE = """
import wdsx
spec, handler = sys.argv[1], getattr(wdsx, sys.argv[2])
dataset = wdsx.WebDataset(sys.argv[3:], shardshuffle=False).decode(spec, handler=handler)
report(lambda: [s["__key__"] for s in dataset])
"""
COMMAND = """
from wdsx.commands import cli
report(lambda: cli.main(sys.argv[1:]))
"""


# --- building hostile inputs in small pieces -------------------------------------------


def tar_member(name: str, data: bytes) -> bytes:
    """One member as ``tarfile`` writes it: its header(s), its data and its padding."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        return out.getvalue()  # before close() adds the end-of-archive blocks


def tar_header(name: str, size: int) -> bytes:
    """The header ``tarfile`` writes for a member of ``size`` bytes (the data follows it)."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def tar_of(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def compressor(kind: str) -> Any:
    return gzip.compress if kind == "gzip" else bz2.compress


def write_zeros(out: Any, size: int, compress: Any) -> None:
    """``size`` zero bytes (a multiple of 1 MiB) as concatenated compressed streams."""
    one = compress(MIB_OF_ZEROS)
    for _ in range(size >> 20):
        out.write(one)


def bomb_shard(path: Any, kind: str) -> str:
    """A compressed tar: a small sample ``a``, then member ``b.bin`` of :data:`BOMB` zeros."""
    compress = compressor(kind)
    with open(path, "wb") as out:
        out.write(compress(tar_member("a.txt", b"hello") + tar_header("b.bin", BOMB)))
        write_zeros(out, BOMB, compress)
        out.write(compress(bytes(1024)))
    return str(path)


def small_shard(path: Any, key: str = "z") -> str:
    path.write_bytes(tar_of({f"{key}.txt": b"fine", f"{key}.cls": b"1"}))
    return str(path)


# --- compressed members ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind, suffix", [("gzip", ".tar.gz"), ("bzip2", ".tar.bz2")])
def test_a_compressed_member_that_inflates_to_1_5_gb_is_refused(tmp_path, kind, suffix):
    url = bomb_shard(tmp_path / f"bomb{suffix}", kind)
    assert os.path.getsize(url) < 2 << 20
    outcome = measured(ITERATE, url).outcome
    assert outcome["error"] == "ShardError", outcome
    assert outcome["url"] == url
    assert outcome["member"] == "b.bin"
    assert outcome["offset"] == len(tar_member("a.txt", b"hello"))
    assert "WDSX_MAX_INFLATE_RATIO" in outcome["message"]

    after = small_shard(tmp_path / "after.tar")
    outcome = measured(ITERATE_ON, url, after).outcome
    assert outcome["result"] == ["a", "z"], outcome  # the sample before it, then the next shard


@pytest.mark.slow
@pytest.mark.parametrize("command", ["ls", "info", "verify"])
def test_commands_refuse_a_compressed_member_that_inflates_to_1_5_gb(tmp_path, command):
    url = bomb_shard(tmp_path / "bomb.tar.gz", "gzip")
    run = measured(COMMAND, command, url)
    assert run.outcome["result"] == 1, run.output
    assert "b.bin" in run.output and "WDSX_MAX_INFLATE_RATIO" in run.output


# --- fields --------------------------------------------------------------------------------


def gz_field_bomb() -> bytes:
    out = io.BytesIO()
    write_zeros(out, BOMB, gzip.compress)
    return out.getvalue()


def npz_field_bomb() -> bytes:
    """An ``.npz`` whose one array, of :data:`BOMB` zero bytes, deflates to a few MB."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_2_0(
                member, {"descr": "|u1", "fortran_order": False, "shape": (BOMB,)}
            )
            for _ in range(BOMB >> 20):
                member.write(MIB_OF_ZEROS)
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("field, build", [("txt.gz", gz_field_bomb), ("npz", npz_field_bomb)])
def test_a_field_that_inflates_to_1_5_gb_is_refused(tmp_path, field, build):
    data = build()
    assert len(data) < 16 << 20
    shard = tmp_path / "fields.tar"
    shard.write_bytes(tar_of({f"s.{field}": data, "t.txt": b"fine"}))
    outcome = measured(DECODE, "rgb8", "reraise_exception", str(shard)).outcome
    assert outcome["error"] == "DecodingError", outcome
    assert (outcome["url"], outcome["key"], outcome["k"]) == (str(shard), "s", field)
    assert "WDSX_MAX_INFLATE_RATIO" in outcome["message"]

    outcome = measured(DECODE, "rgb8", "warn_and_continue", str(shard)).outcome
    assert outcome["result"] == ["t"], outcome


# --- images --------------------------------------------------------------------------------


def jpeg_claiming(height: int, width: int, pixels: np.ndarray | None = None) -> bytes:
    """A JPEG whose frame header says ``height`` x ``width``: a small real JPEG (of
    ``pixels``, else 16 x 16 grey) with those numbers written into its SOF0 marker. Its
    decoder allocates and fills the size the header gives."""
    if pixels is None:
        pixels = np.full((16, 16, 3), 128, np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="JPEG")
    data = bytearray(out.getvalue())
    frame = data.index(b"\xff\xc0")
    data[frame + 5 : frame + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["rgb8", "rgb", "torchrgb"])
def test_a_20000_by_20000_jpeg_is_refused_from_its_header(tmp_path, spec):
    shard = tmp_path / "images.tar"
    shard.write_bytes(tar_of({"big.jpg": jpeg_claiming(20000, 20000), "t.txt": b"fine"}))
    outcome = measured(DECODE, spec, "reraise_exception", str(shard)).outcome
    assert outcome["error"] == "DecodingError", outcome
    assert (outcome["key"], outcome["k"]) == ("big", "jpg")
    assert "20000x20000" in outcome["message"] and "WDSX_MAX_IMAGE_PIXELS" in outcome["message"]

    outcome = measured(DECODE, spec, "warn_and_continue", str(shard)).outcome
    assert outcome["result"] == ["t"], outcome


def small_jpeg(side: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.full((side, side, 3), 100, np.uint8)).save(out, format="JPEG")
    return out.getvalue()


@pytest.mark.slow  # imports webdataset
@pytest.mark.parametrize("spec", ["rgb8", "rgb", "torchrgb", "pil"])
def test_the_default_pixel_limit_is_where_webdataset_refuses(monkeypatch, spec):
    """Unset, the limit is Pillow's refusal point (twice ``Image.MAX_IMAGE_PIXELS``), which
    webdataset meets on every path since it decodes through Pillow."""
    import webdataset

    monkeypatch.delenv(limits.MAX_IMAGE_PIXELS, raising=False)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 1000)
    for side in (30, 46):  # 900 and 2116 pixels, on either side of 2 x 1000
        sample = {"__key__": "k", "__url__": "u", "jpg": small_jpeg(side)}
        try:
            webdataset.autodecode.Decoder([webdataset.imagehandler(spec)])(dict(sample))
            oracle_refuses = False
        except Exception:
            oracle_refuses = True
        try:
            wdsx.Decoder([wdsx.imagehandler(spec)])(dict(sample))
            refused = False
        except DecodingError:
            refused = True
        assert refused == oracle_refuses == (side == 46)
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", None)
    assert limits.max_image_pixels() is None


@pytest.mark.parametrize("spec", ["rgb8", "torchrgb", "pil", "l"])
def test_wdsx_max_image_pixels_applies_on_every_path(monkeypatch, spec):
    monkeypatch.setenv(limits.MAX_IMAGE_PIXELS, "1000")
    decoder = wdsx.Decoder([wdsx.imagehandler(spec)])
    assert decoder({"__key__": "k", "jpg": small_jpeg(30)})["jpg"] is not None
    with pytest.raises(DecodingError, match="46x46 = 2116 pixels, over the limit of 1000"):
        decoder({"__key__": "k", "jpg": small_jpeg(46)})
    with pytest.raises(DecodingError, match="over the limit of 1000"):
        decoder({"__key__": "k", "png": _png(46)})


def _png(side: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.new("RGB", (side, side)).save(out, format="PNG")
    return out.getvalue()


# --- .npy shards ---------------------------------------------------------------------------


def npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, offset, says",
    [
        (npy_header((1 << 40,), "|V0"), 0, "rows hold no data"),
        (b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFFF) + b"{", 8, "header claims 4294967295 bytes"),
        (npy_header((-5, 3), "<f4") + bytes(60), 0, "negative dimension"),
    ],
    ids=["2**40-rows-of-itemsize-0", "4-GB-header", "negative-dimension"],
)
def test_a_hostile_npy_header_is_refused_naming_the_shard(tmp_path, content, offset, says):
    shard = tmp_path / "rows.npy"
    shard.write_bytes(content)
    outcome = measured(ITERATE, str(shard)).outcome
    assert outcome["error"] == "ShardError", outcome
    assert (outcome["url"], outcome["offset"]) == (str(shard), offset)
    assert says in outcome["message"]
    run = measured(COMMAND, "info", str(shard))
    assert run.outcome["result"] == 1 and says in run.output


# --- JSONL -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_256_mb_jsonl_line_ends_in_an_error_and_is_skipped_by_a_continuing_handler(tmp_path):
    shard = tmp_path / "docs.jsonl"
    first, last = b'{"n": 1}\n', b'{"n": 3}\n'
    with open(shard, "wb") as out:
        out.write(first + b'{"text": "')
        for _ in range(256):
            out.write(b"a" * (1 << 20))
        out.write(b'"}\n' + last)
    outcome = measured(ITERATE, str(shard)).outcome
    assert outcome["error"] == "ShardError", outcome
    assert (outcome["url"], outcome["offset"]) == (str(shard), len(first))
    assert "line 2 is 268435468 bytes long" in outcome["message"]

    outcome = measured(ITERATE_ON, str(shard)).outcome
    assert outcome["result"] == ["docs/0", "docs/2"], outcome


def test_lines_over_the_limit_are_refused_and_the_others_read_as_json_loads_reads_them(tmp_path, monkeypatch):
    monkeypatch.setenv(limits.MAX_LINE, "100")
    lines = [{"n": 1}, {"text": "x" * 200}, {"n": 3}, {"text": "y" * 90}]
    encoded = [json.dumps(line).encode() for line in lines]
    shard = tmp_path / "docs.jsonl"
    shard.write_bytes(b"\n".join(encoded) + b"\n")
    got = [s["json"] for s in wdsx.WebDataset(str(shard), handler=wdsx.warn_and_continue)]
    assert got == [json.loads(line) for line in encoded if len(line) <= 100]
    with pytest.raises(ShardError) as raised:
        list(wdsx.WebDataset(str(shard)))
    assert raised.value.offset == len(encoded[0]) + 1
    assert f"line 2 is {len(encoded[1])} bytes long" in str(raised.value)


def test_random_access_refuses_a_line_over_the_limit_without_reading_it(tmp_path, monkeypatch):
    monkeypatch.setenv(limits.MAX_LINE, "100")
    encoded = [json.dumps({"n": 1}).encode(), json.dumps({"text": "x" * 200}).encode()]
    shard = tmp_path / "docs.jsonl"
    shard.write_bytes(b"\n".join(encoded) + b"\n")
    assert subprocess.run([sys.executable, "-m", "wdsx.commands.cli", "index", str(shard)]).returncode == 0
    dataset = wdsx.IndexedDataset(str(shard))
    assert dataset[0]["json"] == json.loads(encoded[0])
    with pytest.raises(ShardError, match="line 2 is .* more than the limit of 100"):
        dataset[1]


# --- tar streams -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_tar_followed_by_endless_zero_bytes_ends_in_an_error(tmp_path):
    shard = tmp_path / "fine.tar"
    shard.write_bytes(tar_of({"a.txt": b"hello", "b.txt": b"world"}))
    url = f"pipe:cat {shard} /dev/zero"
    outcome = measured(ITERATE, url).outcome
    assert outcome["error"] == "TrailingDataError", outcome  # a ShardError
    assert "more than 1 MiB of zero bytes after the end-of-archive marker" in outcome["message"]
    with tarfile.open(shard) as archive:  # the marker follows the last member
        last = archive.getmembers()[-1]
        assert outcome["offset"] == last.offset_data + 512
    outcome = measured(ITERATE_ON, url).outcome
    assert outcome["result"] == ["a", "b"], outcome


def test_zero_padding_after_the_end_of_archive_is_accepted_up_to_1_mib(tmp_path):
    archive = tar_of({"a.txt": b"hello"})
    padded, endless = tmp_path / "padded.tar", tmp_path / "endless.tar"
    marker = 1024  # after the header and the data block of a.txt
    padded.write_bytes(archive + bytes((1 << 20) - (len(archive) - marker)))
    endless.write_bytes(archive + bytes(2 << 20))
    assert [s["txt"] for s in wdsx.WebDataset(str(padded))] == [b"hello"]
    with pytest.raises(ShardError, match="more than 1 MiB of zero bytes"):
        list(wdsx.WebDataset(str(endless)))


def words(size: int) -> bytes:
    """``size`` bytes of text that compresses a few times, as ordinary text does."""
    generator = np.random.default_rng(0)
    vocabulary = np.array([b"the", b"shard", b"reads", b"sample", b"of", b"zebra", b"42"], dtype=object)
    text = b" ".join(vocabulary[generator.integers(0, len(vocabulary), size // 3)])
    return text[:size]


def test_compressed_data_within_the_ratio_reads_as_tarfile_and_gzip_read_it(tmp_path, monkeypatch):
    """Past the grace size, text (a few times smaller compressed) reads whole, and zeros
    (hundreds of times smaller) are refused, in a shard as in a field."""
    monkeypatch.setenv(limits.INFLATE_GRACE, str(1 << 16))
    text = words(1 << 20)
    shard = tmp_path / "text.tar.gz"
    shard.write_bytes(gzip.compress(tar_of({"t.bin": text, "t.txt.gz": gzip.compress(text)})))
    with tarfile.open(shard) as archive:
        member = archive.extractfile("t.bin")
        assert member is not None
        oracle = member.read()
    (sample,) = wdsx.WebDataset(str(shard)).decode()
    assert sample["bin"] == oracle
    assert sample["txt.gz"] == gzip.decompress(gzip.compress(text)).decode()

    zeros = tmp_path / "zeros.tar.gz"
    zeros.write_bytes(gzip.compress(tar_of({"z.bin": bytes(1 << 20)})))
    with pytest.raises(ShardError, match="more than 100 times") as raised:
        list(wdsx.WebDataset(str(zeros)))
    assert (raised.value.member, raised.value.offset) == ("z.bin", 0)
    field = tmp_path / "field.tar"
    field.write_bytes(tar_of({"z.txt.gz": gzip.compress(bytes(1 << 20))}))
    with pytest.raises(DecodingError, match="more than 100 times"):
        list(wdsx.WebDataset(str(field)).decode())
    monkeypatch.setenv(limits.MAX_INFLATE_RATIO, "100000")
    assert [s["__key__"] for s in wdsx.WebDataset(str(zeros))] == ["z"]


@pytest.mark.parametrize("value", ["abc", "0", "-3", "1.5"])
def test_a_limit_that_is_not_a_positive_number_is_an_error(monkeypatch, value):
    monkeypatch.setenv(limits.MAX_LINE, value)
    with pytest.raises(ValueError, match=limits.MAX_LINE):
        limits.max_line_bytes()


# --- preview -------------------------------------------------------------------------------


@pytest.mark.slow
def test_preview_of_samples_with_a_64_kib_key_finishes(tmp_path):
    key = "k" * (64 << 10)
    shard = tmp_path / "long.tar"
    shard.write_bytes(
        tar_of({f"{key}.txt": b"x" * (1 << 20), f"{key}1.jpg": small_jpeg(32), f"{key}1.cls": b"7" * 5000})
    )
    output = tmp_path / "sheet.png"
    run = measured(COMMAND, "preview", str(shard), "-o", str(output))
    assert run.outcome["result"] == 0, run.output
    with PIL.Image.open(output) as sheet:
        assert sheet.width > 0
