"""Hand-built hostile shards, one per finding of the fuzzing run: each ends in a wdsx error that
names the shard and the byte offset, quickly and without taking memory on a header's word.

The shards are raw bytes built here from the ustar layout (:mod:`tests.fuzz.tarbytes`) and
Python's tarfile; each is read from a local file (whose size the reader knows) and through a
``pipe:`` (whose size it does not).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import random
import tarfile
import time
import tracemalloc
import zlib
from collections.abc import Iterator

import pytest
import webdataset

import wdsx
from tests.fuzz import tarbytes
from wdsx.commands import cli
from wdsx.core.compression import Decompressed, DecompressionError
from wdsx.core.errors import NoSamplesError, TrailingDataError
from wdsx.read.manifest import Manifest, ShardEntry, scan_counts

CPU_SECONDS = 1.0
EXTRA_BYTES = 50 << 20


def members(count: int = 8, size: int = 300) -> list[bytes]:
    """``count`` regular members ``k000.txt``..., each a header and its padded data."""
    return [tarbytes.member(b"k%03d.txt" % i, bytes([65 + i % 26]) * size) for i in range(count)]


def archive(parts: list[bytes]) -> bytearray:
    return bytearray(b"".join(parts) + tarbytes.ZERO * 2)


def with_size(field: bytes, at: int = 2) -> tuple[bytes, int]:
    """A shard whose member ``at`` has the raw size ``field`` (checksum made valid); returns it
    and the offset of that header."""
    parts = members()
    offset = sum(len(part) for part in parts[:at])
    data = archive(parts)
    data[offset + 124 : offset + 136] = field
    tarbytes.fix_checksum(data, offset)
    return bytes(data), offset


def pax_sized(value: bytes) -> tuple[bytes, int]:
    """A pax header whose ``size`` record is ``value``, before an ordinary member."""
    parts = members(4)
    records = tarbytes.pax_record(b"size", value)
    parts.insert(2, tarbytes.extended(b"x", records))
    return bytes(archive(parts)), 3 * 1024  # the header of the member the record sizes


def zero_header_mid_shard() -> tuple[bytes, int]:
    data = archive(members())
    data[3 * 1024 : 3 * 1024 + 512] = tarbytes.ZERO  # the fourth member's header
    return bytes(data), 3 * 1024


def zero_block_inserted() -> tuple[bytes, int]:
    data = archive(members())
    return bytes(data[: 5 * 1024] + tarbytes.ZERO + data[5 * 1024 :]), 5 * 1024


def zero_after_pax() -> tuple[bytes, int]:
    parts = members(4)
    parts.insert(
        2, tarbytes.extended(b"x", tarbytes.pax_record(b"path", b"long/" * 30 + b"x.txt")) + tarbytes.ZERO
    )
    return bytes(archive(parts)), 3 * 1024


def leading_zero_block() -> tuple[bytes, int]:
    return bytes(tarbytes.ZERO + archive(members())), 0


HOSTILE = {
    "negative octal size": lambda: with_size(b"-0000001000\0"),
    "negative base-256 size": lambda: with_size(b"\xff" * 11 + b"\x00"),
    "negative size in the first header": lambda: with_size(b"-0000001000\0", at=0),
    "1.5 GB declared": lambda: with_size(b"%011o\0" % 1_500_000_000),
    "8 GiB declared": lambda: with_size(b"%012o" % (8 << 30)),
    "base-256 2^80 declared": lambda: with_size(b"\x80" + (1 << 80).to_bytes(11, "big")),
    "pax size 10^14": lambda: pax_sized(b"100000000000000"),
    "zero header mid-shard": zero_header_mid_shard,
    "zero block inserted": zero_block_inserted,
    "zero block after a pax header": zero_after_pax,
    "leading zero block, then data": leading_zero_block,
}


@contextlib.contextmanager
def within_budget() -> Iterator[None]:
    """The block must take under a second of CPU and under 50 MB of extra (traced) memory."""
    tracemalloc.start()
    started = time.process_time()
    try:
        yield
    finally:
        cpu = time.process_time() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert cpu < CPU_SECONDS, f"took {cpu:.2f} s of CPU"
    assert peak < EXTRA_BYTES, f"took {peak / 1e6:.0f} MB"


def read_all(url: str, **kw: object) -> list[dict]:
    return list(wdsx.WebDataset(url, manifest=False, **kw))


def assert_names(error: BaseException, url: str, offset: int | None) -> None:
    assert isinstance(error, wdsx.ShardError) and isinstance(error, tarfile.ReadError)
    assert error.url == url and url in str(error)
    if offset is not None:
        assert error.offset == offset and f"byte offset {offset}" in str(error)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(HOSTILE))
@pytest.mark.parametrize("via", ["file", "pipe"])
def test_hostile_shard_is_a_named_error_within_budget(tmp_path, case, via):
    data, offset = HOSTILE[case]()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    url = str(path) if via == "file" else f"pipe:cat {path}"
    with within_budget(), pytest.raises(wdsx.ShardError) as caught:
        read_all(url)
    assert_names(caught.value, url, offset)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_header_scans_and_counts_fail_too(tmp_path, case):
    """``counts="scan"``, ``wdsx index`` and ``scan_counts`` read headers only: they raise the
    same errors instead of stepping back onto a header forever or counting wrong."""
    data, offset = HOSTILE[case]()
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    with within_budget():
        with pytest.raises(wdsx.ShardError) as caught:
            scan_counts(str(path))
        assert_names(caught.value, str(path), offset)
        with pytest.raises(wdsx.ShardError):
            wdsx.WebDataset(str(path), manifest=False, counts="scan")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", ["ls", "info", "verify", "index"])
def test_commands_end_with_an_error_on_a_negative_size(tmp_path, capsys, command):
    data, offset = with_size(b"-0000001000\0")
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    assert cli.main([command, str(path)]) == 1
    captured = capsys.readouterr()
    assert (
        "negative member size" in captured.out + captured.err and str(offset) in captured.out + captured.err
    )
    assert not (tmp_path / "shard.manifest.json").exists()


def gz_shard(count: int = 60) -> bytes:
    """A gzip-compressed shard whose payloads do not compress, so damage lands mid-stream."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive_file:
        for i in range(count):
            for ext, data in (("txt", b"%d" % i), ("bin", random.Random(i).randbytes(900))):
                info = tarfile.TarInfo(f"k{i:03d}.{ext}")
                info.size = len(data)
                archive_file.addfile(info, io.BytesIO(data))
    return out.getvalue()


def corrupt_middle(data: bytes) -> bytes:
    damaged = bytearray(data)
    for at in range(len(data) // 2, len(data) // 2 + 16):
        damaged[at] ^= 0x55
    return bytes(damaged)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
@pytest.mark.parametrize("via", ["file", "pipe"])
def test_damaged_gzip_names_shard_and_compressed_offset(tmp_path, damage, via):
    whole = gz_shard()
    data = whole[: len(whole) // 2] if damage == "truncated" else corrupt_middle(whole)
    path = tmp_path / "shard.tar.gz"
    path.write_bytes(data)
    url = str(path) if via == "file" else f"pipe:cat {path}"
    with within_budget(), pytest.raises(wdsx.ShardError) as caught:
        read_all(url)
    assert_names(caught.value, url, None)
    assert "compressed byte offset" in str(caught.value) and "gzip" in str(caught.value)


def decodable_prefix(data: bytes) -> bytes:
    """What an independent decoder (zlib, fed 64 bytes at a time) gets out of a damaged gzip
    stream before it fails."""
    decoder, out = zlib.decompressobj(31), []
    for at in range(0, len(data), 64):
        try:
            out.append(decoder.decompress(data[at : at + 64]))
        except zlib.error:
            break
    return b"".join(out)


def complete_samples(prefix: bytes) -> set[str]:
    """Keys of the samples whose members all lie in ``prefix`` (tarfile reads them)."""
    read: dict[str, int] = {}
    with contextlib.suppress(tarfile.ReadError):
        with tarfile.open(fileobj=io.BytesIO(prefix), mode="r|") as stream:
            for info in stream:
                stream.extractfile(info).read()  # type: ignore[union-attr]
                key = info.name.split(".")[0]
                read[key] = read.get(key, 0) + 1
    return {key for key, fields in read.items() if fields == 2}


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_continuing_handlers_keep_every_sample_before_gzip_damage(tmp_path, damage):
    whole = gz_shard()
    data = whole[: len(whole) // 2] if damage == "truncated" else corrupt_middle(whole)
    (tmp_path / "whole.tar.gz").write_bytes(whole)
    (tmp_path / "damaged.tar.gz").write_bytes(data)
    intact = [s["__key__"] for s in read_all(str(tmp_path / "whole.tar.gz"))]
    kept = [s["__key__"] for s in read_all(str(tmp_path / "damaged.tar.gz"), handler=wdsx.warn_and_continue)]
    expected = complete_samples(decodable_prefix(data))
    assert len(expected) > 10
    assert expected <= set(kept) and kept == intact[: len(kept)]


def test_truncated_tgz_through_a_pipe_behaves_as_in_webdataset(tmp_path):
    """webdataset's drop-in contract: a ``tarfile.ReadError``, and ``ignore_and_stop`` keeps
    the samples before the damage, the same ones."""
    path = tmp_path / "shard.tgz"
    path.write_bytes(gz_shard())
    url = f"pipe:dd if={path} bs=1024 count=10 2>/dev/null"
    with pytest.raises(tarfile.ReadError):
        read_all(url)
    ours = [s["__key__"] for s in read_all(url, handler=wdsx.ignore_and_stop)]
    theirs = [
        s["__key__"]
        for s in webdataset.WebDataset(url, shardshuffle=False, handler=webdataset.ignore_and_stop)
    ]
    assert ours == theirs and len(ours) > 5


@pytest.mark.parametrize("trailing", ["gzip", "tar", "tar in gzip"])
def test_data_after_the_archive_comes_after_its_last_sample(tmp_path, trailing):
    """Bytes after a compressed stream's end, or a second archive after the first one's
    end-of-archive marker: every sample of the archive is whole, so the default handler gets
    all of them, the last one too, before the error, as webdataset (which stops at the marker)
    gets them. The error names the marker's offset, and no member."""
    whole = gz_shard(12)
    if trailing == "gzip":
        path, data = tmp_path / "shard.tar.gz", whole + b"not gzip" * 64
    elif trailing == "tar":
        path, data = tmp_path / "shard.tar", gzip.decompress(whole) * 2
    else:
        path, data = tmp_path / "shard.tar.gz", gzip.compress(gzip.decompress(whole) * 2)
    path.write_bytes(data)
    theirs = [s["__key__"] for s in webdataset.WebDataset(str(path), shardshuffle=False)]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(whole)), mode="r|") as stream:
        stream.getmembers()
        marker = stream.offset  # where the header after the last member would be
    ours = []
    with pytest.raises(wdsx.ShardError) as caught:
        for sample in wdsx.WebDataset(str(path), shardshuffle=False, manifest=False):
            ours.append(sample["__key__"])
    assert ours == theirs == [f"k{i:03d}" for i in range(12)]
    assert caught.value.offset == marker and caught.value.member is None
    assert "after the end-of-archive marker" in str(caught.value)


def test_a_failed_gzip_check_is_damage_not_trailing_data(tmp_path):
    """A byte changed inside a stored (uncompressed) deflate block decodes, wrongly, and only
    the gzip trailer's CRC-32 says so, after the end-of-archive marker: that is damage that
    may lie in samples already delivered, so a plain ShardError, never TrailingDataError
    (whose samples are whole)."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for i in range(3):
            info = tarfile.TarInfo(f"s{i}.txt")
            info.size = len(b"payload 0")
            archive.addfile(info, io.BytesIO(b"payload %d" % i))
    damaged = bytearray(gzip.compress(plain.getvalue(), compresslevel=0))
    damaged[damaged.find(b"payload 1")] = ord("X")
    path = tmp_path / "crc.tar.gz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(zlib.error, match="incorrect data check"):
        zlib.decompress(bytes(damaged), 31)  # the independent decoder's verdict
    with pytest.raises(wdsx.ShardError) as caught:
        read_all(str(path))
    assert not isinstance(caught.value, TrailingDataError)
    assert "incorrect data check" in str(caught.value)


def test_after_gzip_damage_the_position_is_where_the_decoder_failed():
    """The bytes decoded before damage are handed out first (a tar header garbled by the
    damage is reported from them, with the position): by then the compressed position has
    reached the byte an independent decoder (zlib, fed a byte at a time) fails on."""
    data = corrupt_middle(gz_shard())
    decoder, failed_at = zlib.decompressobj(31), None
    for at in range(len(data)):
        try:
            decoder.decompress(data[at : at + 1])
        except zlib.error:
            failed_at = at
            break
    assert failed_at is not None
    stream = Decompressed(io.BytesIO(data).read, "gzip")
    with pytest.raises(DecompressionError) as caught:
        while stream.read(1 << 16):
            pass
    assert stream.position == caught.value.position == failed_at


def test_pax_headers_of_many_tiny_records_cost_their_bytes(tmp_path):
    """Records wdsx does not use are checked and dropped, not kept: two consecutive pax
    headers of 1 MB of tiny distinct records each, then a member, read in a few MB."""
    headers = b""
    for first in (0, 1 << 20):
        records = b"".join(tarbytes.pax_record(b"k%x" % key, b"") for key in range(first, first + 100_000))
        headers += tarbytes.extended(b"x", records)
    path = tmp_path / "records.tar"
    path.write_bytes(headers + tarbytes.member(b"a.txt", b"abc") + tarbytes.ZERO * 2)
    tracemalloc.start()  # memory only: tracing every small allocation costs CPU ten times over
    try:
        samples = read_all(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(headers), f"took {peak / 1e6:.1f} MB for {len(headers) / 1e6:.1f} MB of headers"
    assert [(sample["__key__"], sample["txt"]) for sample in samples] == [("a", b"abc")]
    assert [(s["__key__"], s["txt"]) for s in webdataset.WebDataset(str(path), shardshuffle=False)] == [
        ("a", b"abc")
    ]


def test_fewer_samples_than_the_manifest_says_is_an_error(tmp_path):
    path = tmp_path / "shard-000000.tar"
    path.write_bytes(bytes(archive(members(10))))
    Manifest([ShardEntry(path.name, 20, path.stat().st_size)]).write(str(tmp_path / "shard.manifest.json"))
    with pytest.raises(wdsx.ShardError, match="20") as caught:
        list(wdsx.WebDataset(str(path)))
    assert_names(caught.value, str(path), 10 * 1024)
    with pytest.raises(wdsx.ShardError, match="20"):
        list(wdsx.WebDataset(str(path), manifest=False, counts=[20]))
    assert len(list(wdsx.WebDataset(str(path), manifest=False, counts=[10]))) == 10


def whole_keys(path) -> list[str]:
    """Keys of the members Python's tarfile reads whole from a possibly damaged shard."""
    keys = []
    with contextlib.suppress(tarfile.ReadError), tarfile.open(path, mode="r|") as stream:
        for info in stream:
            stream.extractfile(info).read()  # type: ignore[union-attr]
            keys.append(info.name.split(".")[0])
    return keys


@pytest.mark.parametrize("counting", ["scan", "multi-rank"])
def test_continuing_past_a_truncated_shard_keeps_ranks_equal(tmp_path, monkeypatch, counting):
    """Counting samples before the epoch (``counts="scan"``, or a multi-rank job without a
    manifest) hands damage to the dataset's handler too, and counts the whole samples before
    it, which is what the reader then delivers: so the ranks still get equal shares."""
    shard_keys = []
    for number in range(4):
        parts = [tarbytes.member(b"s%d-%03d.txt" % (number, i), b"x" * 100) for i in range(10)]
        data = archive(parts)
        path = tmp_path / f"s{number}.tar"
        path.write_bytes(bytes(data[: 5 * 1024 + 100]) if number == 2 else bytes(data))
        shard_keys.append(whole_keys(path))
    readable = sorted(key for keys in shard_keys for key in keys)
    assert len(readable) == 35  # tarfile reads 5 of the damaged shard's 10
    urls = str(tmp_path / "s{0..3}.tar")
    delivered, batches = [], []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        options = {"counts": "scan"} if counting == "scan" else {}
        dataset = wdsx.WebDataset(urls, shardshuffle=False, handler=wdsx.warn_and_continue, **options)
        pipeline = dataset.to_tuple("__key__").batched(4, partial=True)
        got = list(pipeline)
        assert len(pipeline) == len(got)
        batches.append(len(got))
        delivered += [key for batch in got for key in batch[0]]
    assert batches[0] == batches[1]
    # the "pad" remainder may read a sample twice to even the last round; none is lost
    assert set(delivered) == set(readable) and len(delivered) - len(readable) <= 2


def test_a_rank_left_short_by_skipped_damage_says_so(tmp_path, monkeypatch, caplog):
    """Damage the counts do not know of (here counts given by hand) cuts a rank's share
    short: the reader warns, naming the shard and how many samples its rank lost."""
    path = tmp_path / "s0.tar"
    path.write_bytes(bytes(archive(members(10)))[: 5 * 1024 + 100])
    (tmp_path / "s1.tar").write_bytes(bytes(archive(members(10))))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = wdsx.WebDataset(
        str(tmp_path / "s{0..1}.tar"), shardshuffle=False, counts=[10, 10], handler=wdsx.warn_and_continue
    )
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        assert len(list(dataset)) == 5
    short = [r.getMessage() for r in caplog.records if "dealt to rank 0" in r.getMessage()]
    assert len(short) == 1 and str(path) in short[0] and ": 5 of the samples" in short[0]


def test_a_dataset_without_samples_is_webdatasets_error(tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(bytes(archive([tarbytes.header(b"folder/", 0, b"5"), tarbytes.member(b"noext", b"x")])))
    with pytest.raises(ValueError) as theirs:
        list(webdataset.WebDataset(str(empty), shardshuffle=False))
    with pytest.raises(NoSamplesError) as ours:
        list(wdsx.WebDataset(str(empty), manifest=False))
    assert isinstance(ours.value, ValueError) and isinstance(ours.value, tarfile.ReadError)
    assert str(theirs.value).splitlines()[0] in str(ours.value) and str(empty) in str(ours.value)
    assert list(wdsx.WebDataset(str(empty), manifest=False, empty_check=False)) == []


def test_not_a_tar_archive_says_so(tmp_path, capsys):
    text = tmp_path / "notes.tar"
    text.write_bytes(b"these are notes, not a tar archive\n" * 40)
    with pytest.raises(wdsx.ShardError, match="not a tar archive") as caught:
        read_all(str(text))
    assert caught.value.member is None
    assert cli.main(["ls", str(text)]) == 1
    assert "not a tar archive" in capsys.readouterr().err


def test_member_names_in_errors_are_printable_and_short(tmp_path):
    data = archive(members())
    garbage = bytes(range(1, 100))
    data[1024 : 1024 + 100] = garbage
    data[1024 + 345 : 1024 + 500] = bytes(range(100, 255))
    data[1024 + 124 : 1024 + 136] = b"-0000001000\0"
    tarbytes.fix_checksum(data, 1024)
    (tmp_path / "x.tar").write_bytes(bytes(data))
    with pytest.raises(wdsx.ShardError) as caught:
        read_all(str(tmp_path / "x.tar"))
    message = str(caught.value)
    assert message.isprintable() and len(message) < 400 and "..." in message


def test_warnings_of_skipped_damage_name_the_shard(tmp_path, caplog):
    data, offset = zero_block_inserted()
    (tmp_path / "x.tar").write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        keys = [s["__key__"] for s in read_all(str(tmp_path / "x.tar"), handler=wdsx.warn_and_continue)]
    assert keys == [f"k{i:03d}" for i in range(5)]
    assert any(f"byte offset {offset}" in record.getMessage() for record in caplog.records)
