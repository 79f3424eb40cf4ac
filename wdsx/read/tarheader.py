"""What one tar header, pax extended header or GNU long name says, checked: the layout,
the numbers (octal or GNU base-256), the checksum, pax records and long names, and the type
codes. :mod:`wdsx.read.tar` reads streams of them."""

from __future__ import annotations

import zlib

from wdsx.core.errors import ShardError

BLOCK = 512
EXTENDED_LIMIT = 1 << 24
"""The most bytes a pax or GNU long-name header's data may hold (16 MiB)."""
ZERO_BLOCK = bytes(BLOCK)
REGULAR_FILE = 0x30  # '0'
REGULAR = frozenset((REGULAR_FILE, 0x00, 0x37))  # '0', NUL, '7' (contiguous file)
NO_DATA = frozenset(b"123456")
"""Links, devices, directories and fifos: no data blocks follow them, whatever their size
field says (POSIX, and ``tarfile``)."""
PAX_LOCAL = frozenset((0x78, 0x58))  # 'x', and Solaris' 'X'
PAX_GLOBAL = 0x67  # 'g'
GNU_LONGNAME = 0x4C  # 'L'
GNU_LONGLINK = 0x4B  # 'K'
GNU_SPARSE = 0x53  # 'S'
GNU_TYPES = frozenset((GNU_LONGNAME, GNU_LONGLINK, GNU_SPARSE))
EXTENDED = frozenset((*PAX_LOCAL, PAX_GLOBAL, GNU_LONGNAME, GNU_LONGLINK))
_GLOBAL_REFUSED = ("path", "size", "GNU.sparse.")
"""Global pax records that would change every later member's name or size: refused rather
than half-understood."""
_CHARSETS = ("ISO-IR 10646 2000 UTF-8", "BINARY")
"""The two character sets a pax header may declare for its names (POSIX)."""
ADLER_MOD = 65521


def text(raw: bytes) -> str:
    """A NUL-terminated header field as text (bytes that are not UTF-8 kept as surrogates, as
    ``tarfile`` keeps them)."""
    end = raw.find(0)
    if end >= 0:
        raw = raw[:end]
    return raw.decode("utf-8", "surrogateescape")


def number(field: bytes) -> int:
    """Decode a numeric header field: octal text, or GNU base-256 for large values."""
    if field and field[0] in (0x80, 0xFF):
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            value -= 256 ** (len(field) - 1)
        return value
    end = field.find(0)
    if end >= 0:
        field = field[:end]
    field = field.strip()
    return int(field, 8) if field else 0


def checksum_ok(header: bytes, stored: int) -> bool:
    """Exact tar checksum test: the unsigned byte sum with the checksum field read as spaces.

    ``adler32``'s low half is ``1 + sum(bytes) mod 65521``; the true sum of 512 bytes is below
    2 * 65521, so it is one of two candidates.
    """
    field_sum = sum(header[148:156])
    claimed = stored + field_sum - 256
    low = (zlib.adler32(header) & 0xFFFF) - 1
    if claimed == low or claimed == low + ADLER_MOD:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + b"        " + header[156:])
    return stored == signed


def looks_like_header(block: bytes) -> bool:
    """Whether ``block`` is a tar header with a valid checksum, or the end-of-archive block."""
    if len(block) != BLOCK:
        return False
    if block == ZERO_BLOCK:
        return True
    try:
        return checksum_ok(block, number(block[148:156]))
    except ValueError:
        return False


_USED = frozenset({"path", "size", "hdrcharset"})
"""The pax records that decide how a member is read; the others are checked, then dropped."""


def pax_records(data: bytes, url: str, offset: int, kind: int) -> dict[str, str]:
    """The records of a local or global pax header that decide members' names and sizes,
    parsed strictly: every ``"<len> <key>=<value>\\n"`` record well framed, nothing but NUL
    padding after the last. Only :data:`_USED` records are kept, so a header of a million
    tiny records costs the header's bytes, not a dict of a million entries."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise ShardError(url, offset, "malformed pax header (a record without a length)")
        length = int(digits)
        end = pos + length
        if length < 5 or end > len(data) or data[end - 1] != 0x0A:
            raise ShardError(url, offset, "malformed pax header (a record's length does not frame it)")
        key_bytes, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep or not key_bytes:
            raise ShardError(url, offset, "malformed pax header (a record without 'key=')")
        key = key_bytes.decode("utf-8", "surrogateescape")
        if key.startswith("GNU.sparse."):
            raise ShardError(url, offset, "GNU sparse members are not supported")
        if kind == PAX_GLOBAL and key.startswith(_GLOBAL_REFUSED):
            raise ShardError(url, offset, f"global pax header sets {key!r} for every member (not supported)")
        if key in _USED:
            records[key] = value.decode("utf-8", "surrogateescape")
        pos = end
    if data[pos:].strip(b"\0"):
        raise ShardError(url, offset, "malformed pax header (data after its last record)")
    if records.get("hdrcharset", _CHARSETS[0]) not in _CHARSETS:
        raise ShardError(url, offset, f"unknown pax hdrcharset {records['hdrcharset'][:40]!r}")
    if "path" in records:
        records["path"] = records["path"].rstrip("/")
    if "size" in records:
        records["size"] = str(_pax_size(records["size"], url, offset))
    return records


def _pax_size(text: str, url: str, offset: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ShardError(url, offset, f"invalid pax size {text[:40]!r}") from None
    if value < 0:
        raise ShardError(url, offset, f"negative pax size {text[:40]!r}")
    return value


def long_name(data: bytes, url: str, offset: int) -> str:
    """A GNU long name: its text up to the NUL that ends it (GNU tar counts the NUL in the
    size; one missing means the size field is wrong)."""
    end = data.find(0)
    if end < 0:
        raise ShardError(url, offset, "GNU long name without its terminating NUL")
    return data[:end].decode("utf-8", "surrogateescape")


def joined(prefix: str, name_field: bytes) -> str:
    """A member's path from its ustar prefix and name field."""
    name = text(name_field)
    return f"{prefix}/{name}" if prefix else name
