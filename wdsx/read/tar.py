"""A streaming tar reader that knows the byte offset of every member, and trusts no header.

The standard library's ``tarfile`` spends most of webdataset's time (two checksum passes and
a file object per member). This reader parses the 512-byte headers straight out of a large
read buffer, verifies each checksum with ``zlib.adler32`` (one C call), and yields plain
``(name, header_offset, data)`` tuples for regular files. It understands ustar, pax extended
headers (long names, large sizes, global headers) and GNU long names; directories, links and
devices are skipped, as webdataset skips them. Members are read the way ``tarfile`` reads
them (which extended header wins, which types carry data), so both see the same samples.

Every shard is hostile until proven otherwise. Errors never end a shard silently: each raises
:class:`~wdsx.core.errors.ShardError` naming the URL, the member and the byte offset:

- a bad checksum, a negative or non-numeric size, a truncated member or header;
- a size beyond what the stream can still deliver (``available``: the known size of a local
  file) or beyond the per-member limit. Nothing is allocated on a header's word: a member of
  unknown-length stream grows as its bytes actually arrive;
- a zero block followed by anything but zeros, or right after an extended header: tar's
  end-of-archive marker ends the archive, so data after it would be silently lost;
- a file that is not a tar at all ("not a tar archive");
- damage in a compressed stream, with the offset in the compressed bytes.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Generator
from typing import Any, Protocol, cast

from wdsx.core.compression import DecompressionError
from wdsx.core.env import max_member_bytes
from wdsx.core.errors import ShardError
from wdsx.core.streams import read_into

BLOCK = 512
CHUNK = 1 << 20
SCAN_CHUNK = 4 * BLOCK
"""Buffer of a header scan that can seek: payloads that do not fit are seeked over."""
EXTENDED_LIMIT = 1 << 24
"""The most bytes a pax or GNU long-name header's data may hold (16 MiB)."""
_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = frozenset((0x30, 0x00, 0x37))  # '0', NUL, '7' (contiguous file)
_NO_DATA = frozenset(b"123456")
"""Links, devices, directories and fifos: no data blocks follow them, whatever their size
field says (POSIX, and ``tarfile``)."""
_PAX_LOCAL = frozenset((0x78, 0x58))  # 'x', and Solaris' 'X'
_PAX_GLOBAL = 0x67  # 'g'
_GNU_LONGNAME = 0x4C  # 'L'
_GNU_LONGLINK = 0x4B  # 'K'
_GNU_SPARSE = 0x53  # 'S'
_GNU_TYPES = frozenset((_GNU_LONGNAME, _GNU_LONGLINK, _GNU_SPARSE))
_EXTENDED = frozenset((*_PAX_LOCAL, _PAX_GLOBAL, _GNU_LONGNAME, _GNU_LONGLINK))
_GLOBAL_REFUSED = ("path", "size", "GNU.sparse.")
"""Global pax records that would change every later member's name or size: refused rather
than half-understood."""
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
    """Parse pax extended-header records, ``"<len> <key>=<value>\\n"``, strictly: every record
    well framed, nothing but NUL padding after the last."""
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
        key, sep, value = data[space + 1 : end - 1].partition(b"=")
        if not sep or not key:
            raise ShardError(url, offset, "malformed pax header (a record without 'key=')")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    if data[pos:].strip(b"\0"):
        raise ShardError(url, offset, "malformed pax header (data after its last record)")
    return records


def _pax_records(data: bytes, url: str, offset: int, kind: int) -> dict[str, str]:
    """The records of a local or global pax header that decide members' names and sizes."""
    records = _parse_pax(data, url, offset)
    for key in records:
        if key.startswith("GNU.sparse."):
            raise ShardError(url, offset, "GNU sparse members are not supported")
        if kind == _PAX_GLOBAL and key.startswith(_GLOBAL_REFUSED):
            raise ShardError(url, offset, f"global pax header sets {key!r} for every member (not supported)")
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


def _long_name(data: bytes, url: str, offset: int) -> str:
    """A GNU long name: its text up to the NUL that ends it (GNU tar counts the NUL in the
    size; one missing means the size field is wrong)."""
    end = data.find(0)
    if end < 0:
        raise ShardError(url, offset, "GNU long name without its terminating NUL")
    return data[:end].decode("utf-8", "surrogateescape")


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


def _grown(
    readinto: Callable[[memoryview], int], scratch: memoryview, have: memoryview, size: int
) -> bytearray:
    """``have`` plus the stream's next bytes up to ``size`` in all, growing only as bytes
    arrive: a header claiming a huge size costs nothing unless the bytes are really there."""
    data = bytearray(have)
    while len(data) < size:
        got = readinto(scratch[: min(len(scratch), size - len(data))])
        if not got:
            break
        data += scratch[:got]
    return data


def _first_nonzero(data: memoryview) -> int:
    """Index of the first non-zero byte of ``data``, or -1."""
    raw = data.tobytes()
    rest = raw.lstrip(b"\0")
    return len(raw) - len(rest) if rest else -1


def _check_end(
    readinto: Callable[[memoryview], int],
    view: memoryview,
    first: int,
    filled: int,
    at: int,
    url: str,
    marker: int,
) -> None:
    """After the end-of-archive marker at ``marker`` only zero padding may follow, up to the
    end of the stream. ``view[first:filled]`` holds the bytes already read from offset ``at``."""
    while True:
        found = _first_nonzero(view[first:filled])
        if found >= 0:
            raise ShardError(
                url, marker, f"data after the end-of-archive marker: byte {at + found} is not zero"
            )
        at += filled - first
        first, filled = 0, readinto(view)
        if not filled:
            return


def _ended(url: str, base: int, start: int, filled: int, entry: int | None) -> ShardError:
    """The error for a stream that ends where a header should be, ``filled`` bytes into it."""
    if base == 0 and start == 0:
        if not filled:
            return ShardError(url, 0, "empty file (truncated shard?)")
        return ShardError(url, 0, f"not a tar archive (only {filled} bytes, less than one tar header)")
    after = f" after the extended header at byte {entry}" if entry is not None else ""
    if not filled:
        return ShardError(
            url, base, f"stream ends without an end-of-archive marker{after} (truncated shard?)"
        )
    return ShardError(url, base, f"truncated tar header ({filled} of {BLOCK} bytes){after}")


_unpack_header = struct.Struct("100s24x12s12x8sB188xB").unpack_from
"""(name, size, checksum, type flag, first byte of the ustar prefix) of a header in a buffer."""


def _joined(prefix: str, name_field: bytes) -> str:
    """A member's path from its ustar prefix and name field."""
    name = _text(name_field)
    return f"{prefix}/{name}" if prefix else name


def _shown(pending: dict[str, str] | None, name_field: bytes, prefix: str) -> str | None:
    """The name of the member being read, for an error message."""
    if pending is not None and "path" in pending:
        return pending["path"]
    return _joined(prefix, name_field) or None


def _bad_header(url: str, offset: int, start: int, reason: str, header: bytes) -> ShardError:
    """The error for a header that fails its checks. At the very start of a stream the file is
    most likely not a tar archive at all, and its "name" would be noise."""
    if offset == 0 and start == 0:
        return ShardError(url, 0, f"not a tar archive ({reason})")
    prefix = _text(header[345:500]) if header[156] not in _GNU_TYPES else ""
    return ShardError(url, offset, reason, _joined(prefix, header[:100]) or None)


def _walk(
    readinto: Callable[[memoryview], int],
    skip: Callable[[int], object] | None,
    url: str,
    start: int,
    chunk: int,
    available: int | None,
    max_member: int | None,
    keep: bool,
) -> Generator[tuple[str, int, Any], None, int]:
    """The tar engine behind :func:`iter_members` (``keep``: yield each member's data) and
    :func:`scan_headers` (yield its size; ``skip(n)``, when given, seeks over payloads).

    Returns the offset of the end-of-archive marker. See :func:`iter_members` for the rules.
    """
    limit = max_member_bytes() if max_member is None else max_member
    stream_end = None if available is None else start + available
    buf = bytearray(max(chunk, 4 * BLOCK))
    view = memoryview(buf)
    capacity = len(buf)
    filled = 0  # bytes of buf holding stream data
    pos = 0  # buffer position of the next header
    base = start  # stream offset of buf[0]
    adler = zlib.adler32
    pending: dict[str, str] | None = None  # path and size from extended headers: the first wins
    entry: int | None = None  # offset of the first pending extended header
    offset = start
    name_field, prefix = b"", ""
    try:
        while True:
            end = pos + BLOCK
            if end > filled:
                if pos > filled:  # the padding of the last member lies beyond the buffer
                    if _discard(readinto, view, pos - filled) < pos - filled:
                        raise ShardError(
                            url,
                            offset,
                            "truncated shard: it ends inside a member's padding",
                            _joined(prefix, name_field),
                        )
                    base, filled = base + pos, 0
                else:
                    rest = bytes(view[pos:filled])
                    base, filled = base + pos, len(rest)
                    view[:filled] = rest
                pos, end = 0, BLOCK
                filled = _fill(readinto, view, filled, BLOCK)
                if filled < BLOCK:
                    raise _ended(url, base, start, filled, entry)
            offset = base + pos
            low = adler(view[pos:end]) & 0xFFFF
            if low == 1 and not any(view[pos:end]):
                if entry is not None:
                    raise ShardError(
                        url,
                        offset,
                        f"zero block right after the extended header at byte {entry} (its member is missing)",
                    )
                _check_end(readinto, view, end, filled, base + end, url, offset)
                return offset
            name_field, size_field, sum_field, kind, prefixed = _unpack_header(buf, pos)
            try:
                stored = int(sum_field[:6], 8) if sum_field[6] in (0, 32) else _number(sum_field)
                size = int(size_field[:11], 8) if size_field[11] in (0, 32) else _number(size_field)
            except ValueError:
                header = bytes(view[pos:end])
                try:
                    stored, size = _number(sum_field), _number(size_field)
                except ValueError:
                    raise _bad_header(
                        url, offset, start, "invalid tar header (not a number)", header
                    ) from None
            claimed = stored + sum(sum_field) - 256
            if claimed != low - 1 and claimed != low - 1 + _ADLER_MOD:
                header = bytes(view[pos:end])
                if not _checksum_ok(header, stored):
                    raise _bad_header(url, offset, start, "invalid tar header (bad checksum)", header)
            prefix = _text(bytes(view[pos + 345 : pos + 500])) if prefixed else ""
            if size < 0:
                raise ShardError(
                    url, offset, f"negative member size {size}", _shown(pending, name_field, prefix)
                )
            directory = kind == 0 and _text(name_field).endswith("/")  # an old-style directory entry
            if kind in _EXTENDED:
                bound = min(limit, EXTENDED_LIMIT)
            elif kind in _NO_DATA or directory:
                size, bound = 0, limit  # no data follows, whatever the size field says
            else:
                if pending is not None and "size" in pending:
                    size = int(pending["size"])
                bound = limit
            if size > bound:
                raise ShardError(
                    url,
                    offset,
                    f"member size {size} exceeds the limit of {bound} bytes",
                    _shown(pending, name_field, prefix),
                )
            if stream_end is not None and offset + BLOCK + size > stream_end:
                raise ShardError(
                    url,
                    offset,
                    f"truncated member: {size} bytes declared, "
                    f"{stream_end - offset - BLOCK} bytes left in the shard",
                    _shown(pending, name_field, prefix),
                )
            wanted = kind in _EXTENDED or (keep and kind in _REGULAR)
            data_end = end + size
            padded_end = end + ((size + BLOCK - 1) & ~(BLOCK - 1))
            data = b""
            if data_end <= filled:
                if wanted:
                    data = bytes(view[end:data_end])
                pos = padded_end
            elif size + BLOCK <= capacity:  # move the member to the front, then read the rest of it
                rest = bytes(view[pos:filled])
                base, filled = base + pos, len(rest)
                view[:filled] = rest
                end, data_end, padded_end = BLOCK, BLOCK + size, BLOCK + (padded_end - end)
                filled = _fill(readinto, view, filled, data_end)
                if filled < data_end:
                    raise ShardError(
                        url,
                        offset,
                        f"truncated member: {filled - BLOCK} of {size} bytes present",
                        _shown(pending, name_field, prefix),
                    )
                if wanted:
                    data = bytes(view[end:data_end])
                pos = padded_end
            else:  # a member larger than the buffer is assembled outside it, or passed over
                have = filled - end
                if wanted:
                    grown = _grown(readinto, view, view[end:filled], size)
                    got = len(grown)
                    data = bytes(grown)
                    del grown
                elif skip is not None:
                    skip(size - have)
                    got = size
                else:
                    got = have + _discard(readinto, view, size - have)
                if got < size:
                    raise ShardError(
                        url,
                        offset,
                        f"truncated member: {got} of {size} bytes present",
                        _shown(pending, name_field, prefix),
                    )
                padding = padded_end - data_end
                if skip is not None and not wanted:
                    skip(padding)
                elif _discard(readinto, view, padding) < padding:
                    raise ShardError(
                        url,
                        offset,
                        "truncated shard: it ends inside a member's padding",
                        _shown(pending, name_field, prefix),
                    )
                base, pos, filled = base + padded_end, 0, 0
            if kind in _REGULAR and not directory:
                if pending is not None and "path" in pending:
                    name = pending["path"]
                else:  # _joined(prefix, name_field), inlined: this runs once per member
                    stop = name_field.find(0)
                    name = name_field[: stop if stop >= 0 else 100].decode("utf-8", "surrogateescape")
                    if prefix:
                        name = prefix + "/" + name
                at = offset if entry is None else entry
                pending = entry = None
                yield name, at, data if keep else size
            elif kind in _PAX_LOCAL or kind == _GNU_LONGNAME:
                if kind == _GNU_LONGNAME:
                    records = {"path": _long_name(data, url, offset)}
                else:
                    records = _pax_records(data, url, offset, kind)
                pending = records if pending is None else {**records, **pending}
                entry = offset if entry is None else entry
            elif kind in _EXTENDED:  # a global pax header or a long link name: checked, then unused
                if kind == _PAX_GLOBAL:
                    _pax_records(data, url, offset, kind)
                entry = offset if entry is None else entry
            elif kind == _GNU_SPARSE:
                raise ShardError(
                    url, offset, "GNU sparse members are not supported", _shown(pending, name_field, prefix)
                )
            else:  # directories, links, devices, fifos, unknown types: not samples
                pending = entry = None
    except DecompressionError as exn:
        raise ShardError(url, offset, str(exn), _shown(pending, name_field, prefix)) from exn


def iter_members(
    stream: Readable,
    url: str,
    start: int = 0,
    chunk: int = CHUNK,
    *,
    available: int | None = None,
    max_member: int | None = None,
) -> Generator[Member, None, int]:
    """Yield ``(name, header_offset, data)`` for every regular file in a tar byte stream, and
    return the offset of the end-of-archive marker.

    ``start`` is the offset in the tar stream at which ``stream`` begins; it must be a member's
    first header (or 0). The offset yielded is that of the member's first header (its pax or
    GNU long-name header when it has one), so a reader can later resume from it.

    ``available``, when known, is how many bytes ``stream`` holds from ``start`` to its end
    (a local file's size): a member declared larger than that is an error before anything is
    read. ``max_member`` bounds any member's size (default: ``WDSX_MAX_MEMBER_BYTES``, else
    16 GiB). The stream is read in large blocks into one reusable buffer; each member's data
    is copied out of it once. A member larger than the buffer grows only as its bytes arrive.

    Everything that is not a well-formed tar raises :class:`~wdsx.core.errors.ShardError`
    (see the module's docstring); a stream that ends without tar's end-of-archive block is
    reported as truncated, and only zero bytes may follow that block.
    """
    walk = _walk(readinto_of(stream), None, url, start, chunk, available, max_member, True)
    return cast(Generator[Member, None, int], walk)


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
    read: Callable[[int], bytes],
    skip: Callable[[int], object] | None,
    url: str,
    start: int = 0,
    *,
    available: int | None = None,
    max_member: int | None = None,
) -> Generator[tuple[str, int, int], None, int]:
    """Yield ``(name, entry_offset, size)`` for regular files without keeping their payloads,
    by the same rules and with the same errors as :func:`iter_members`.

    ``skip(n)``, when given, moves the stream ``n`` bytes forward without reading (a relative
    seek on a local file), which makes counting the samples of a local shard cheap; with it,
    pass ``available`` so that a member claiming more bytes than the file holds is caught.
    """
    chunk = SCAN_CHUNK if skip is not None else CHUNK
    walk = _walk(functools.partial(read_into, read), skip, url, start, chunk, available, max_member, False)
    return cast(Generator[tuple[str, int, int], None, int], walk)
