"""A streaming tar reader that knows the byte offset of every member.

The standard library's ``tarfile`` spends most of webdataset's time (two checksum passes and
a file object per member). This reader parses the 512-byte headers straight out of a large
read buffer, verifies each checksum with ``zlib.adler32`` (one C call), and yields plain
``(name, header_offset, data)`` tuples for regular files. It understands ustar, pax extended
headers (long names, large sizes, global headers) and GNU long names; directories, links and
devices are skipped, as webdataset skips them.

Errors never end a shard silently: a bad checksum, a truncated member or a malformed header
raises :class:`~wdsx.errors.ShardError` naming the URL, the member and the byte offset.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Iterator
from typing import Protocol

from wdsx.core.errors import ShardError
from wdsx.core.streams import read_into

BLOCK = 512
CHUNK = 1 << 20
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset((0x30, 0x00, 0x37))  # '0', NUL, '7' (contiguous file)
_PAX_LOCAL = 0x78  # 'x'
_PAX_GLOBAL = 0x67  # 'g'
_GNU_LONGNAME = 0x4C  # 'L'
_GNU_LONGLINK = 0x4B  # 'K'
_GNU_SPARSE = 0x53  # 'S'
_GNU_TYPES = frozenset((_GNU_LONGNAME, _GNU_LONGLINK, _GNU_SPARSE))
_ADLER_MOD = 65521

Member = tuple[str, int, bytes]


def _text(raw: bytes) -> str:
    end = raw.find(0)
    if end >= 0:
        raw = raw[:end]
    return raw.decode("utf-8", "surrogateescape")


def _number(field: bytes) -> int:
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


def _checksum_ok(header: bytes, stored: int) -> bool:
    """Exact tar checksum test: the unsigned byte sum with the checksum field read as spaces.

    ``adler32``'s low half is ``1 + sum(bytes) mod 65521``; the true sum of 512 bytes is below
    2 * 65521, so it is one of two candidates.
    """
    field_sum = sum(header[148:156])
    claimed = stored + field_sum - 256
    low = (zlib.adler32(header) & 0xFFFF) - 1
    if claimed == low or claimed == low + _ADLER_MOD:
        return True
    signed = sum(b - 256 if b > 127 else b for b in header[:148] + b"        " + header[156:])
    return stored == signed


def looks_like_header(block: bytes) -> bool:
    """Whether ``block`` is a tar header with a valid checksum, or the end-of-archive block."""
    if len(block) != BLOCK:
        return False
    if block == _ZERO_BLOCK:
        return True
    try:
        return _checksum_ok(block, _number(block[148:156]))
    except ValueError:
        return False


def _parse_pax(data: bytes, url: str, offset: int) -> dict[str, str]:
    """Parse pax extended-header records: ``"<len> <key>=<value>\\n"``."""
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            if data[pos:].strip(b"\0\n ") == b"":
                break
            raise ShardError(url, offset, "malformed pax header")
        try:
            length = int(data[pos:space])
        except ValueError:
            raise ShardError(url, offset, "malformed pax header record length") from None
        if length <= 0 or pos + length > len(data):
            raise ShardError(url, offset, "pax header record overruns its block")
        record = data[space + 1 : pos + length - 1]
        key, sep, value = record.partition(b"=")
        if not sep:
            raise ShardError(url, offset, "pax header record without '='")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class Readable(Protocol):
    """A byte stream: ``read(n)``, and ideally ``readinto(buffer)`` (used when present)."""

    def read(self, n: int) -> bytes: ...


def readinto_of(stream: Readable) -> Callable[[memoryview], int]:
    """The stream's ``readinto``, or one built from its ``read``."""
    readinto = getattr(stream, "readinto", None)
    return readinto if readinto is not None else functools.partial(read_into, stream.read)


def _fill(readinto: Callable[[memoryview], int], view: memoryview, filled: int, need: int) -> int:
    """Read into ``view`` after its first ``filled`` bytes until ``need`` are there or the
    stream ends; returns how many are there."""
    while filled < need:
        count = readinto(view[filled:])
        if not count:
            break
        filled += count
    return filled


def _discard(readinto: Callable[[memoryview], int], scratch: memoryview, count: int) -> int:
    """Read and drop ``count`` bytes; returns how many could be dropped."""
    dropped = 0
    while dropped < count:
        got = readinto(scratch[: min(len(scratch), count - dropped)])
        if not got:
            break
        dropped += got
    return dropped


_unpack_header = struct.Struct("100s24x12s12x8sB188xB").unpack_from
"""(name, size, checksum, type flag, first byte of the ustar prefix) of a header in a buffer."""


def iter_members(stream: Readable, url: str, start: int = 0, chunk: int = CHUNK) -> Iterator[Member]:
    """Yield ``(name, header_offset, data)`` for every regular file in a tar byte stream.

    ``start`` is the offset in the tar stream at which ``stream`` begins; it must be a member's
    first header (or 0). The offset yielded is that of the member's first header (its pax or
    GNU long-name header when it has one), so a reader can later resume from it. A stream that
    ends without tar's end-of-archive block is reported as truncated.

    The stream is read in large blocks into one reusable buffer; each member's data is copied
    out of it once.
    """
    readinto = readinto_of(stream)
    buf = bytearray(max(chunk, 4 * BLOCK))
    view = memoryview(buf)
    capacity = len(buf)
    filled = 0  # bytes of buf holding stream data
    pos = 0  # buffer position of the next header
    base = start  # stream offset of buf[0]
    adler = zlib.adler32
    long_name: str | None = None
    pax: dict[str, str] = {}
    entry: int | None = None  # offset of a pending pax / long-name header
    name_field, prefix, offset = b"", "", start
    while True:
        end = pos + BLOCK
        if end > filled:
            if pos > filled:  # the padding of the last member lies beyond the buffer
                if _discard(readinto, view, pos - filled) < pos - filled:
                    raise ShardError(url, offset, "stream ends inside a member's padding", _text(name_field))
                base, filled = base + pos, 0
            else:
                rest = bytes(view[pos:filled])
                base, filled = base + pos, len(rest)
                view[:filled] = rest
            pos, end = 0, BLOCK
            filled = _fill(readinto, view, filled, BLOCK)
            if filled < BLOCK:
                if not filled:
                    reason = "empty file" if base == 0 else "stream ends without an end-of-archive block"
                    raise ShardError(url, base, reason + " (truncated shard?)")
                raise ShardError(url, base, f"truncated tar header ({filled} of 512 bytes)")
        name_field, size_field, sum_field, kind, prefixed = _unpack_header(buf, pos)
        low = adler(view[pos:end]) & 0xFFFF
        offset = base + pos
        if low == 1 and not any(view[pos:end]):
            return
        try:
            stored = int(sum_field[:6], 8) if sum_field[6] in (0, 32) else _number(sum_field)
            size = int(size_field[:11], 8) if size_field[11] in (0, 32) else _number(size_field)
        except ValueError:
            header = bytes(view[pos:end])
            try:
                stored, size = _number(sum_field), _number(size_field)
            except ValueError:
                raise ShardError(
                    url, offset, "invalid tar header (not a number)", _safe_name(header)
                ) from None
        claimed = stored + sum(sum_field) - 256
        if claimed != low - 1 and claimed != low - 1 + _ADLER_MOD:
            header = bytes(view[pos:end])
            if not _checksum_ok(header, stored):
                raise ShardError(url, offset, "invalid tar header (bad checksum)", _safe_name(header))
        prefix = _text(bytes(view[pos + 345 : pos + 500])) if prefixed else ""
        if pax and "size" in pax:
            size = _pax_int(pax["size"], url, offset)
        data_end = end + size
        padded_end = end + ((size + BLOCK - 1) & ~(BLOCK - 1))
        if data_end <= filled:
            data = bytes(view[end:data_end])
            pos = padded_end
        elif size + BLOCK <= capacity:  # move the member to the front, then read the rest of it
            rest = bytes(view[pos:filled])
            base, filled = base + pos, len(rest)
            view[:filled] = rest
            end, data_end, padded_end = BLOCK, BLOCK + size, BLOCK + (padded_end - end)
            filled = _fill(readinto, view, filled, data_end)
            if filled < data_end:
                name = long_name or pax.get("path") or _joined(prefix, name_field)
                raise ShardError(
                    url, offset, f"truncated member: {filled - BLOCK} of {size} bytes present", name
                )
            data = bytes(view[end:data_end])
            pos = padded_end
        else:  # a member larger than the buffer is assembled outside it
            data = bytearray(size)
            have = filled - end
            data[:have] = view[end:filled]
            got = _fill(readinto, memoryview(data), have, size)
            if got < size:
                name = long_name or pax.get("path") or _joined(prefix, name_field)
                raise ShardError(url, offset, f"truncated member: {got} of {size} bytes present", name)
            data = bytes(data)
            padding = padded_end - data_end
            if _discard(readinto, view, padding) < padding:
                raise ShardError(url, offset, "stream ends inside a member's padding", _text(name_field))
            base, pos, filled = base + padded_end, 0, 0
        if kind in _REGULAR:
            if long_name is not None:
                name, long_name = long_name, None
            elif pax and "path" in pax:
                name = pax["path"]
            else:  # _joined(prefix, name_field), inlined: one call fewer per member
                stop = name_field.find(0)
                name = name_field[: stop if stop >= 0 else 100].decode("utf-8", "surrogateescape")
                if prefix:
                    name = prefix + "/" + name
            if pax:
                pax = {}
            if entry is not None:
                offset, entry = entry, None
            if kind == 0 and name.endswith("/"):  # an old-style directory entry
                continue
            yield name, offset, data
        elif kind == _PAX_LOCAL:
            entry = offset if entry is None else entry
            pax = _parse_pax(data, url, offset)
        elif kind == _PAX_GLOBAL:
            _parse_pax(data, url, offset)  # validated; global records do not change members here
        elif kind == _GNU_LONGNAME:
            entry = offset if entry is None else entry
            long_name = _text(data)
        elif kind == _GNU_SPARSE:
            raise ShardError(url, offset, "GNU sparse members are not supported", _joined(prefix, name_field))
        elif kind != _GNU_LONGLINK:  # directories, links, devices, fifos: not samples
            long_name = entry = None
            if pax:
                pax = {}


def _pax_int(text: str, url: str, offset: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ShardError(url, offset, f"invalid pax size {text!r}") from None
    if value < 0:
        raise ShardError(url, offset, f"invalid pax size {text!r}")
    return value


def _joined(prefix: str, name_field: bytes) -> str:
    """A member's path from its ustar prefix and name field."""
    name = _text(name_field)
    return f"{prefix}/{name}" if prefix else name


def _member_name(header: bytes) -> str:
    prefix = _text(header[345:500]) if header[156] not in _GNU_TYPES else ""
    return _joined(prefix, header[:100])


def _safe_name(header: bytes) -> str | None:
    try:
        return _member_name(header) or None
    except Exception:
        return None


def read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """``n`` bytes from ``read``, or fewer only when the stream ends."""
    parts = []
    while n > 0:
        part = read(n)
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def scan_headers(
    read: Callable[[int], bytes], skip: Callable[[int], object] | None, url: str, start: int = 0
) -> Iterator[tuple[str, int, int]]:
    """Yield ``(name, entry_offset, size)`` for regular files without keeping their payloads.

    ``skip(n)``, when given, moves the stream ``n`` bytes forward without reading (a relative
    seek on a local file), which makes counting the samples of a local shard cheap.
    """
    offset = start
    long_name: str | None = None
    pax: dict[str, str] = {}
    entry: int | None = None
    while True:
        header = read_exact(read, BLOCK)
        if len(header) < BLOCK:
            reason = "stream ends without an end-of-archive block" if not header else "truncated tar header"
            raise ShardError(url, offset, reason + " (truncated shard?)")
        if header == _ZERO_BLOCK:
            return
        try:
            stored = _number(header[148:156])
            size = _number(header[124:136])
        except ValueError:
            raise ShardError(url, offset, "invalid tar header (not a number)", _safe_name(header)) from None
        if not _checksum_ok(header, stored):
            raise ShardError(url, offset, "invalid tar header (bad checksum)", _safe_name(header))
        kind = header[156]
        if "size" in pax:
            size = _pax_int(pax["size"], url, offset)
        padded = (size + BLOCK - 1) & ~(BLOCK - 1)
        if kind in (_PAX_LOCAL, _GNU_LONGNAME, _PAX_GLOBAL):
            data = read_exact(read, padded)
            if len(data) < size:
                raise ShardError(url, offset, "truncated extended header")
            if kind != _PAX_GLOBAL:
                entry = offset if entry is None else entry
            if kind == _PAX_LOCAL:
                pax = _parse_pax(data[:size], url, offset)
            elif kind == _GNU_LONGNAME:
                long_name = _text(data[:size])
        else:
            if kind in _REGULAR:
                name = long_name if long_name is not None else pax.get("path") or _member_name(header)
                if not (kind == 0 and name.endswith("/")):
                    yield name, offset if entry is None else entry, size
            if kind != _GNU_LONGLINK:
                long_name = entry = None
                pax = {}
            if skip is not None:
                skip(padded)
            elif len(read_exact(read, padded)) < padded:
                raise ShardError(url, offset, "truncated member", _safe_name(header))
        offset += BLOCK + padded
