"""The tar reader against Python's tarfile, on hand-built and random archives."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.shards import tar_bytes, write_tar
from wdsx.errors import ShardError
from wdsx.read.tar import iter_members, scan_headers

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    """What Python's tarfile sees: regular files, in order."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive if m.isreg()]


class Trickle:
    """A read-only stream (no readinto) that returns fewer bytes than asked, like a pipe."""

    def __init__(self, data: bytes, step: int):
        self.stream = io.BytesIO(data)
        self.step = step

    def read(self, n: int) -> bytes:
        return self.stream.read(min(n, self.step))


def wdsx_members(data: bytes, chunk: int = 1 << 20, trickle: int = 0) -> list[tuple[str, bytes]]:
    stream = Trickle(data, trickle) if trickle else io.BytesIO(data)
    return [(name, payload) for name, _, payload in iter_members(stream, "mem", chunk=chunk)]


names = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"),
    min_size=1,
    max_size=30,
)
paths = st.lists(names, min_size=1, max_size=6).map("/".join)
payloads = st.binary(max_size=3000)


@settings(max_examples=150, deadline=None)
@given(
    members=st.lists(st.tuples(paths, payloads), min_size=0, max_size=12),
    fmt=st.sampled_from(sorted(FORMATS)),
    chunk=st.sampled_from([512, 1024, 4096, 1 << 20]),
    trickle=st.sampled_from([0, 1, 333, 5000]),
)
@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_random_archives_match_tarfile(members, fmt, chunk, trickle):
    try:
        data = tar_bytes(members, FORMATS[fmt])
    except (ValueError, UnicodeEncodeError):  # the format cannot hold such a name
        return
    assert wdsx_members(data, chunk, trickle) == tarfile_members(data)


def build_mixed(fmt: int) -> bytes:
    """Directories, links, long names, dots in directories, unicode and an empty file."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:

        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = link
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        add("dir.v1", kind=tarfile.DIRTYPE)
        add("dir.v1/a.b.jpg", b"x" * 700)
        add("d" * 120 + "/long.txt", b"long")
        add("link.txt", kind=tarfile.SYMTYPE, link="dir.v1/a.b.jpg")
        add("hard.txt", kind=tarfile.LNKTYPE, link="dir.v1/a.b.jpg")
        add("ünïcode/ß.json", b"{}")
        add("empty.bin", b"")
        add("fifo", kind=tarfile.FIFOTYPE)
        add("big.npy", bytes(range(256)) * 5000)
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_mixed_members_match_tarfile(fmt):
    data = build_mixed(FORMATS[fmt])
    assert wdsx_members(data, 1024) == tarfile_members(data)


def test_a_pax_size_applies_to_a_member_of_unknown_type():
    """A pax ``size`` record sizes the member after it whatever its type (tarfile agrees): a
    reader that used the header's size would take that member's data for the next header."""
    built = io.BytesIO()
    with tarfile.open(fileobj=built, mode="w", format=tarfile.PAX_FORMAT) as archive:
        odd = tarfile.TarInfo("odd")
        odd.type, odd.size, odd.pax_headers = b"V", 0, {"size": "1024"}
        archive.addfile(odd)
        after = tarfile.TarInfo("a.txt")
        after.size = 5
        archive.addfile(after, io.BytesIO(b"hello"))
    raw = built.getvalue()
    raw = raw[:1536] + b"x" * 1024 + raw[1536:]  # the odd member's 1024 bytes, after its header
    expected = [(m.name, m.size) for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.isfile()]
    assert [(name, len(data)) for name, _, data in iter_members(io.BytesIO(raw), "u")] == expected
    assert [(name, size) for name, _, size in scan_headers(io.BytesIO(raw).read, None, "u")] == expected


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_offset_resumes_at_its_member(fmt):
    members = [("a" * 150 + f"/{i}.txt", bytes([i]) * (i * 100)) for i in range(8)]
    if fmt == "ustar":
        members = [(f"x/{i}.txt", data) for i, (_, data) in enumerate(members)]
    data = tar_bytes(members, FORMATS[fmt])
    expected = tarfile_members(data)
    for number, (_, offset, _) in enumerate(iter_members(io.BytesIO(data), "mem")):
        stream = io.BytesIO(data)
        stream.seek(offset)
        rest = [(n, p) for n, _, p in iter_members(stream, "mem", start=offset)]
        assert rest == expected[number:]


def test_header_scan_finds_the_same_members():
    data = build_mixed(tarfile.PAX_FORMAT)
    stream = io.BytesIO(data)
    scanned = list(scan_headers(stream.read, lambda n: stream.seek(n, 1), "mem"))
    read = list(iter_members(io.BytesIO(data), "mem"))
    assert [(name, offset, len(payload)) for name, offset, payload in read] == scanned


def test_truncated_member_names_url_member_and_offset():
    data = tar_bytes([("a.txt", b"1" * 100), ("b.txt", b"2" * 5000)])
    cut = data[: 512 + 512 + 512 + 2000]
    with pytest.raises(ShardError) as caught:
        wdsx_members(cut)
    error = caught.value
    assert error.url == "mem" and error.member == "b.txt" and error.offset == 1024
    assert "b.txt" in str(error) and "1024" in str(error) and "mem" in str(error)


def test_corrupt_header_is_an_error_not_an_early_end():
    data = bytearray(tar_bytes([("a.txt", b"1" * 100), ("b.txt", b"2" * 100), ("c.txt", b"3")]))
    data[1024 + 10] ^= 0xFF  # damage the name of b.txt's header, invalidating its checksum
    with pytest.raises(ShardError, match="checksum") as caught:
        wdsx_members(bytes(data))
    assert caught.value.offset == 1024
    with pytest.raises(tarfile.ReadError):  # also catchable as webdataset users catch tar errors
        wdsx_members(bytes(data))


def test_missing_end_of_archive_is_reported_as_truncation():
    data = tar_bytes([("a.txt", b"1" * 100)])
    with pytest.raises(ShardError, match="end-of-archive"):
        wdsx_members(data[:1024])
    with pytest.raises(ShardError, match="empty"):
        wdsx_members(b"")


@pytest.mark.parametrize("suffix", [".tar.gz", ".tar.bz2", ".tar.xz", ".tgz"])
def test_compressed_shards_read_and_resume_like_plain_ones(tmp_path, suffix):
    import wdsx

    members = [(f"k{i:03d}.{ext}", f"{i}{ext}".encode() * 50) for i in range(30) for ext in ("a", "b")]
    path = str(tmp_path / ("shard" + suffix))
    mode = {"gz": "w:gz", "bz2": "w:bz2", "xz": "w:xz", "tgz": "w:gz"}[suffix.rsplit(".", 1)[-1]]
    with tarfile.open(path, mode) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    expected = [f"k{i:03d}" for i in range(30)]
    dataset = wdsx.WebDataset(path, manifest=False)
    iterator = iter(dataset)
    first = [next(iterator)["__key__"] for _ in range(11)]
    resumed = wdsx.WebDataset(path, manifest=False)
    resumed.load_state_dict(dataset.state_dict())
    assert first + [s["__key__"] for s in resumed] == expected


def test_a_shard_compressed_without_saying_so_resumes(tmp_path):
    import gzip

    import wdsx

    members = [(f"k{i:03d}.{ext}", f"{i}{ext}".encode() * 50) for i in range(30) for ext in ("a", "b")]
    plain = tar_bytes(members)
    path = tmp_path / "shard.tar"
    path.write_bytes(gzip.compress(plain))
    dataset = wdsx.WebDataset(str(path), manifest=False)
    iterator = iter(dataset)
    first = [next(iterator)["__key__"] for _ in range(7)]
    resumed = wdsx.WebDataset(str(path), manifest=False)
    resumed.load_state_dict(dataset.state_dict())
    assert first + [s["__key__"] for s in resumed] == [f"k{i:03d}" for i in range(30)]


def test_a_duplicate_member_goes_to_the_handler_and_the_shard_reads_on_as_on_webdataset(tmp_path):
    import webdataset

    members = [("a.txt", b"a"), ("b.txt", b"b1"), ("b.txt", b"b2"), ("c.txt", b"c"), ("d.txt", b"d")]
    shard = write_tar(str(tmp_path / "dup.tar"), members)

    def read(library):
        dataset = library.WebDataset(shard, shardshuffle=False, handler=library.ignore_and_continue)
        return [(sample["__key__"], sample["txt"]) for sample in dataset]

    assert read(wdsx) == read(webdataset) == [("a", b"a"), ("b", b"b1"), ("c", b"c"), ("d", b"d")]
    with pytest.raises(
        ShardError, match=r"duplicate extension 'txt' in sample 'b'.*'b.txt' at byte offset 2048"
    ):
        list(wdsx.WebDataset(shard, shardshuffle=False))
