"""What a shard should give, worked out without wdsx: Python's ``tarfile`` reads the members,
webdataset's ``group_by_keys`` groups them into samples.

``tarfile`` stops silently at a bad header, so its members alone cannot tell a complete archive
from a damaged one; the verdict also looks at where it stopped: an archive is *clean* when
``tarfile`` stopped at a zero block followed by nothing but zeros (tar's end-of-archive
marker and padding). Anything else (a bad header, a truncation, data after the marker, a
damaged compressed stream, a member ``tarfile`` cannot read, a duplicate field) is *damaged*:
a reader must raise, or deliver the undamaged shard's samples unchanged.

Two of ``tarfile``'s habits are not tar's rules and are corrected for: it refuses a header
whose mode, owner, time or device fields are not numbers (they do not affect a member's name
or data, so such a header is repaired and the archive read again), and it follows a negative
size backwards (reported as damage instead of looping).
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

from webdataset.tariterators import group_by_keys

from tests.fuzz import tarbytes

Sample = dict[str, Any]
_MAGIC = {b"\x1f\x8b": gzip.decompress, b"BZh": bz2.decompress, b"\xfd7zXZ\x00": lzma.decompress}
_METADATA_FIELDS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))
_EXTENDED_TYPES = b"xgXLK"
_REPAIRS = 8


class _Damage(Exception):
    def __init__(self, offset: int, reason: str):
        super().__init__(reason)
        self.offset = offset


@dataclass(frozen=True)
class Verdict:
    """``clean`` with the samples it holds, or damaged with a reason."""

    clean: bool
    samples: list[Sample] | None
    reason: str = ""


def _members(tar: bytes) -> list[tuple[str, bytes]]:
    """The regular members ``tarfile`` reads, raising :class:`_Damage` unless it ends at a
    proper end-of-archive marker."""
    try:
        archive = tarfile.open(fileobj=io.BytesIO(tar), mode="r:")
    except Exception as exn:
        raise _Damage(0, f"tarfile refuses the archive: {exn}") from None
    found = []
    last = -1
    while True:
        at = archive.offset
        try:
            info = archive.next()
        except Exception as exn:
            raise _Damage(at, f"tarfile: {type(exn).__name__}: {exn}") from None
        if info is None:
            break
        if info.offset_data <= last or info.size < 0:
            raise _Damage(info.offset, "a negative size (tarfile would read backwards)")
        last = info.offset_data
        if info.isreg():
            if info.type == tarfile.GNUTYPE_SPARSE or info.sparse is not None:
                raise _Damage(info.offset, "a sparse member")
            try:
                found.append((info.name, archive.extractfile(info).read()))  # type: ignore[union-attr]
            except Exception as exn:
                raise _Damage(info.offset, f"tarfile cannot read a member: {exn}") from None
    stop = archive.offset
    marker = tar[stop : stop + tarbytes.BLOCK]
    if len(marker) < tarbytes.BLOCK or any(marker):
        raise _Damage(stop, "tarfile stopped where there is no end-of-archive marker")
    if any(tar[stop + tarbytes.BLOCK :]):
        raise _Damage(stop, "data after the end-of-archive marker")
    return found


def _valid_header(block: bytes) -> bool:
    if len(block) != tarbytes.BLOCK:
        return False
    try:
        return tarfile.nti(block[148:156]) in tarfile.calc_chksums(block) and tarfile.nti(block[124:136]) >= 0
    except (ValueError, tarfile.HeaderError):
        return False


def _repaired(tar: bytes, at: int) -> bytes | None:
    """``tar`` with the metadata number fields of the header at ``at`` (or of the member an
    extended header there leads to) replaced by zeros, when they are what ``tarfile`` choked
    on; None when there is nothing such to repair."""
    for _ in range(4):
        block = tar[at : at + tarbytes.BLOCK]
        if not _valid_header(block):
            return None
        broken = []
        for start, end in _METADATA_FIELDS:
            try:
                tarfile.nti(block[start:end])
            except (ValueError, tarfile.HeaderError):
                broken.append((start, end))
        if broken:
            fixed = bytearray(tar)
            for start, end in broken:
                fixed[at + start : at + end] = tarbytes.octal(0, end - start)
            tarbytes.fix_checksum(fixed, at)
            return bytes(fixed)
        if block[156] not in _EXTENDED_TYPES:
            return None
        at += tarbytes.BLOCK + -(-tarfile.nti(block[124:136]) // tarbytes.BLOCK) * tarbytes.BLOCK
    return None


def _is_meta(name: str) -> bool:
    """webdataset's ``tar_file_iterator`` skips these members."""
    top_level = "/" not in name and name.startswith("__") and name.endswith("__")
    return top_level or re.match(r"__[^/]*__($|/)", name) is not None


def samples_of(members: list[tuple[str, bytes]]) -> list[Sample]:
    """Members grouped into samples by webdataset (ValueError on a duplicate field)."""
    files = [{"fname": name, "data": data, "__url__": "u"} for name, data in members if not _is_meta(name)]
    return [{k: v for k, v in sample.items() if k != "__url__"} for sample in group_by_keys(iter(files))]


def tar_verdict(tar: bytes) -> Verdict:
    """The verdict on uncompressed tar bytes."""
    for _ in range(_REPAIRS):
        try:
            members = _members(tar)
        except _Damage as damage:
            repaired = _repaired(tar, damage.offset)
            if repaired is None:
                return Verdict(False, None, str(damage))
            tar = repaired
            continue
        try:
            return Verdict(True, samples_of(members))
        except ValueError as exn:
            return Verdict(False, None, f"webdataset refuses the grouping: {exn}")
    return Verdict(False, None, "too many damaged headers")


def verdict(stored: bytes) -> Verdict:
    """The verdict on a shard file's bytes (compressed or not)."""
    for magic, decompress in _MAGIC.items():
        if stored.startswith(magic):
            try:
                tar = decompress(stored)
            except Exception as exn:
                return Verdict(False, None, f"damaged compressed stream: {type(exn).__name__}: {exn}")
            return tar_verdict(tar)
    return tar_verdict(stored)


_STREAMS = {
    "gzip": (b"\x1f\x8b", lambda: zlib.decompressobj(16 + zlib.MAX_WBITS)),
    "bzip2": (b"BZh", bz2.BZ2Decompressor),
    "xz": (b"\xfd7zXZ\x00", lzma.LZMADecompressor),
}


def decompress_streams(data: bytes, kind: str) -> bytes:
    """The bytes of ``data``, one or more ``kind`` streams (gzip, bzip2, xz) one after another,
    with zero bytes allowed between and after them; ValueError on anything else (damage, a
    truncated stream, other data after one). This is the framing rule wdsx documents, applied
    with the standard library's decoders; Python's own ``gzip.decompress`` refuses zero padding
    and ``bz2.decompress`` silently drops whatever follows a stream it cannot read."""
    if not data:
        return b""
    magic, new_decoder = _STREAMS[kind]
    parts = []
    rest = data
    while True:
        decoder = new_decoder()
        try:
            parts.append(decoder.decompress(rest))
        except (zlib.error, OSError, lzma.LZMAError, EOFError) as exn:
            raise ValueError(f"damaged {kind} stream: {exn}") from None
        if not decoder.eof:
            raise ValueError(f"the {kind} stream is truncated")
        rest = decoder.unused_data.lstrip(b"\0")
        if not rest:
            return b"".join(parts)
        if not rest.startswith(magic):
            raise ValueError(f"data after the end of the {kind} stream")
