"""The valid shards that fuzz inputs start from: small (a few KB, so that a million inputs run in
minutes), written by Python's tarfile in its three formats, by wdsx's TarWriter and by hand,
with long names (pax and GNU long-name headers), directories, links, metadata members, and
gzip, bzip2 or xz compression."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import tarfile
from dataclasses import dataclass

from tests.fuzz import tarbytes
from wdsx.write.writer import TarWriter

FIELDS = ("txt", "cls", "bin", "json", "seg.png", "npy")
SIZES = (0, 1, 7, 100, 511, 512, 513, 900, 1500)
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
COMPRESSORS = {
    "gzip": lambda data: gzip.compress(data, 6, mtime=0),
    "bzip2": lambda data: bz2.compress(data, 9),
    "xz": lzma.compress,
}


@dataclass(frozen=True)
class Base:
    """One valid shard: its tar bytes and how they are stored."""

    name: str
    tar: bytes
    compression: str | None

    def stored(self, tar: bytes | None = None) -> bytes:
        """The bytes of the shard file for ``tar`` (default: this shard's own)."""
        tar = self.tar if tar is None else tar
        return tar if self.compression is None else COMPRESSORS[self.compression](tar)


def _key(rng: random.Random, number: int, writer: str) -> str:
    if writer in ("gnu", "pax") and rng.random() < 0.5:  # long enough for an extended header
        return "d" * rng.randint(90, 160) + f"/k{number}"
    if writer == "pax" and rng.random() < 0.3:
        return f"ünï/k{number}"
    depth = rng.randint(0, 2)
    return "/".join(["sub"] * depth + [f"k{number:03d}"])


def _members(rng: random.Random, writer: str) -> list[tuple[str, bytes]]:
    members = []
    for number in range(rng.randint(1, 5)):
        key = _key(rng, number, writer)
        for field in rng.sample(FIELDS, rng.randint(1, 3)):
            members.append((f"{key}.{field}", rng.randbytes(rng.choice(SIZES))))
    return members


def _with_tarfile(rng: random.Random, members: list[tuple[str, bytes]], fmt: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as archive:
        for name, data in members:
            if rng.random() < 0.1:
                folder = tarfile.TarInfo(name.rsplit("/", 1)[0] + "/" if "/" in name else "dir")
                folder.type = tarfile.DIRTYPE
                archive.addfile(folder)
            if rng.random() < 0.05:
                link = tarfile.TarInfo(f"link{len(data)}.lnk")
                link.type, link.linkname = tarfile.SYMTYPE, name
                archive.addfile(link)
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1_700_000_000
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def by_wdsx(members: list[tuple[str, bytes]]) -> bytes:
    """``(name, data)`` members written as samples by wdsx's TarWriter."""
    out = io.BytesIO()
    with TarWriter(out, encoder=False) as writer:
        for name, data in members:
            key, _, field = name.partition(".")
            writer.write({"__key__": key, field: data})
    return out.getvalue()


def _by_hand(rng: random.Random, members: list[tuple[str, bytes]]) -> bytes:
    """Raw headers: GNU long names, a pax size record, a metadata member, old-style entries."""
    parts = [tarbytes.member(b"__meta__", b"{}")] if rng.random() < 0.3 else []
    for name, data in members:
        encoded = name.encode()
        choice = rng.random()
        if choice < 0.25:
            parts.append(tarbytes.extended(b"L", encoded + b"\0", b"././@LongLink"))
            parts.append(tarbytes.member(b"placeholder", data))
        elif choice < 0.5:
            records = tarbytes.pax_record(b"path", encoded) + tarbytes.pax_record(b"size", b"%d" % len(data))
            parts.append(tarbytes.extended(b"x", records))
            parts.append(tarbytes.header(b"placeholder", 0) + tarbytes.padded(data))
        else:
            parts.append(tarbytes.member(encoded, data, rng.choice([b"0", b"\0", b"7"])))
    return b"".join(parts) + bytes(tarbytes.BLOCK * rng.choice([2, 2, 20]))


def build(seed: int, number: int) -> Base:
    """Base shard ``number`` of the corpus of ``seed``."""
    rng = random.Random(f"corpus:{seed}:{number}")
    writer = rng.choice(["ustar", "gnu", "pax", "wdsx", "hand"])
    members = _members(rng, writer)
    if writer in FORMATS:
        tar = _with_tarfile(rng, members, FORMATS[writer])
    elif writer == "wdsx":
        tar = by_wdsx(members)
    else:
        tar = _by_hand(rng, members)
    draw = rng.random()
    compression = None if draw < 0.7 else "gzip" if draw < 0.9 else "bzip2" if draw < 0.95 else "xz"
    return Base(f"{writer}-{number}{'.' + compression if compression else ''}", tar, compression)


def corpus(seed: int, size: int = 64) -> list[Base]:
    """The ``size`` base shards of ``seed``."""
    return [build(seed, number) for number in range(size)]
