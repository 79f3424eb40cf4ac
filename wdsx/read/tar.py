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
  end-of-archive marker ends the archive, so data after it would be silently lost; more than
  :data:`MAX_END_PADDING` zero bytes after it (a stream that never ends);
- a file that is not a tar at all ("not a tar archive");
- damage in a compressed stream, with the offset in the compressed bytes, and a compressed
  stream that inflates beyond :mod:`wdsx.core.limits` (a decompression bomb).
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Generator
from typing import Any, Protocol, cast

from wdsx.core.compression import DataAfterStreamError, DecompressionError
from wdsx.core.errors import ShardError, TrailingDataError
from wdsx.core.limits import max_member_bytes
from wdsx.core.streams import read_into
from wdsx.read.tarheader import (
    ADLER_MOD,
    BLOCK,
    EXTENDED,
    EXTENDED_LIMIT,
    GNU_LONGNAME,
    GNU_SPARSE,
    GNU_TYPES,
    NO_DATA,
    PAX_GLOBAL,
    PAX_LOCAL,
    REGULAR,
    REGULAR_FILE,
    checksum_ok,
    joined,
    long_name,
    number,
    pax_records,
    text,
)

CHUNK = 1 << 20
SCAN_CHUNK = 4 * BLOCK
"""Buffer of a header scan that can seek: payloads that do not fit are seeked over."""
MAX_END_PADDING = 1 << 20
"""The most zero bytes accepted after the end-of-archive marker. Writers pad an archive to a
whole record (10 KiB for GNU tar); a stream that goes on sending zeros is not a tar."""

Member = tuple[str, int, bytes]


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
    end of the stream and at most :data:`MAX_END_PADDING` bytes of it; anything else raises
    :class:`TrailingDataError`. Damage a compressed stream's decoder finds there (its check of
    the whole stream failing, say) raises a plain :class:`ShardError`: the bytes before the
    marker may be damaged too. ``view[first:filled]`` holds the bytes already read from
    offset ``at``."""
    while True:
        found = _first_nonzero(view[first:filled])
        if found >= 0:
            raise TrailingDataError(
                url, marker, f"data after the end-of-archive marker: byte {at + found} is not zero"
            )
        at += filled - first
        if at - marker > MAX_END_PADDING:
            raise TrailingDataError(
                url,
                marker,
                f"more than {MAX_END_PADDING >> 20} MiB of zero bytes after the end-of-archive marker",
            )
        try:
            first, filled = 0, readinto(view)
        except DataAfterStreamError as exn:  # the stream itself is whole and checked
            raise TrailingDataError(url, marker, f"after the end-of-archive marker: {exn}") from exn
        except DecompressionError as exn:  # damage, or a failed check of the whole stream
            raise ShardError(url, marker, f"after the end-of-archive marker: {exn}") from exn
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


def _shown(pending: dict[str, str] | None, name_field: bytes, prefix: str) -> str | None:
    """The name of the member being read, for an error message."""
    if pending is not None and "path" in pending:
        return pending["path"]
    return joined(prefix, name_field) or None


def _bad_header(url: str, offset: int, start: int, reason: str, header: bytes) -> ShardError:
    """The error for a header that fails its checks. At the very start of a stream the file is
    most likely not a tar archive at all, and its "name" would be noise."""
    if offset == 0 and start == 0:
        return ShardError(url, 0, f"not a tar archive ({reason})")
    prefix = text(header[345:500]) if header[156] not in GNU_TYPES else ""
    return ShardError(url, offset, reason, joined(prefix, header[:100]) or None)


def _walk(
    readinto: Callable[[memoryview], int],
    skip: Callable[[int], object] | None,
    url: str,
    start: int,
    chunk: int,
    available: int | None,
    max_member: int | None,
    keep: bool,
) -> Generator[list[tuple[str, int, Any]], None, int]:
    """The tar engine behind :func:`iter_members` (``keep``: each member's data) and
    :func:`scan_headers` (its size; ``skip(n)``, when given, seeks over payloads).

    Yields the members parsed from each fill of the read buffer as one list, and before a
    member is moved to the front of the buffer or assembled outside it (a reader then steps
    through members at C speed, not one generator resumption each); before an error, the
    members parsed ahead of it. Returns the offset of the end-of-archive marker. See
    :func:`iter_members` for the rules.
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
    out: list[tuple[str, int, Any]] = []  # members parsed since the last fill of the buffer
    try:
        while True:
            end = pos + BLOCK
            if end > filled:
                if out:
                    parsed, out = out, []
                    yield parsed
                if pos > filled:  # the padding of the last member lies beyond the buffer
                    if _discard(readinto, view, pos - filled) < pos - filled:
                        raise ShardError(
                            url,
                            offset,
                            "truncated shard: it ends inside a member's padding",
                            joined(prefix, name_field),
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
                if out:
                    parsed, out = out, []
                    yield parsed
                _check_end(readinto, view, end, filled, base + end, url, offset)
                return offset
            name_field, size_field, sum_field, kind, prefixed = _unpack_header(buf, pos)
            try:
                stored = int(sum_field[:6], 8) if sum_field[6] in (0, 32) else number(sum_field)
                size = int(size_field[:11], 8) if size_field[11] in (0, 32) else number(size_field)
            except ValueError:
                header = bytes(view[pos:end])
                try:
                    stored, size = number(sum_field), number(size_field)
                except ValueError:
                    raise _bad_header(
                        url, offset, start, "invalid tar header (not a number)", header
                    ) from None
            claimed = stored + sum(sum_field) - 256
            if claimed != low - 1 and claimed != low - 1 + ADLER_MOD:
                header = bytes(view[pos:end])
                if not checksum_ok(header, stored):
                    raise _bad_header(url, offset, start, "invalid tar header (bad checksum)", header)
            prefix = text(bytes(view[pos + 345 : pos + 500])) if prefixed else ""
            if size < 0:
                raise ShardError(
                    url, offset, f"negative member size {size}", _shown(pending, name_field, prefix)
                )
            # '0' (the usual type) first; an old-style directory entry is a NUL-type member
            # whose name ends with "/"
            regular = kind == REGULAR_FILE or (
                kind in REGULAR and not (kind == 0 and text(name_field).endswith("/"))
            )
            bound = limit
            if regular:
                wanted = keep
                if pending is not None and "size" in pending:
                    size = int(pending["size"])
            elif kind in EXTENDED:
                wanted, bound = True, min(limit, EXTENDED_LIMIT)
            else:
                wanted = False
                if kind in NO_DATA or kind == 0:  # (a NUL-type member here is a directory)
                    size = 0  # no data follows, whatever the size field says
                elif pending is not None and "size" in pending:  # a type tar does not know
                    size = int(pending["size"])
            if size > bound:
                raise ShardError(
                    url,
                    offset,
                    f"member size {size} exceeds the limit of {bound} bytes",
                    _shown(pending, name_field, prefix),
                )
            data_end = end + size
            padded_end = end + ((size + BLOCK - 1) & ~(BLOCK - 1))
            data = b""
            if data_end <= filled:  # the member's bytes are here: it cannot be truncated
                if wanted:
                    data = bytes(view[end:data_end])
                pos = padded_end
            elif stream_end is not None and offset + BLOCK + size > stream_end:
                raise ShardError(
                    url,
                    offset,
                    f"truncated member: {size} bytes declared, "
                    f"{stream_end - offset - BLOCK} bytes left in the shard",
                    _shown(pending, name_field, prefix),
                )
            elif size + BLOCK <= capacity:  # move the member to the front, then read the rest of it
                if out:
                    parsed, out = out, []
                    yield parsed
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
                if out:
                    parsed, out = out, []
                    yield parsed
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
            if regular:
                if pending is not None and "path" in pending:
                    name = pending["path"]
                else:  # joined(prefix, name_field), inlined: this runs once per member
                    stop = name_field.find(0)
                    name = name_field[: stop if stop >= 0 else 100].decode("utf-8", "surrogateescape")
                    if prefix:
                        name = prefix + "/" + name
                at = offset if entry is None else entry
                pending = entry = None
                out.append((name, at, data if keep else size))
            elif kind in PAX_LOCAL or kind == GNU_LONGNAME:
                if kind == GNU_LONGNAME:
                    records = {"path": long_name(data, url, offset)}
                else:
                    records = pax_records(data, url, offset, kind)
                pending = records if pending is None else {**records, **pending}
                entry = offset if entry is None else entry
            elif kind in EXTENDED:  # a global pax header or a long link name: checked, then unused
                if kind == PAX_GLOBAL:
                    pax_records(data, url, offset, kind)
                entry = offset if entry is None else entry
            elif kind == GNU_SPARSE:
                raise ShardError(
                    url, offset, "GNU sparse members are not supported", _shown(pending, name_field, prefix)
                )
            else:  # directories, links, devices, fifos, unknown types: not samples
                pending = entry = None
    except GeneratorExit:
        raise
    except DecompressionError as exn:
        if out:  # what was parsed before the damage is delivered first
            yield out
        raise ShardError(url, offset, str(exn), _shown(pending, name_field, prefix)) from exn
    except Exception:
        if out:
            yield out
        raise


def _one_by_one(walk: Generator[list[Any], None, int]) -> Generator[Any, None, int]:
    """The members of :func:`_walk`'s lists, one at a time; returns what it returns."""
    while True:
        try:
            parsed = next(walk)
        except StopIteration as stop:
            return cast(int, stop.value)
        yield from parsed


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
    16 GiB; see :mod:`wdsx.core.limits`). The stream is read in large blocks into one reusable
    buffer; each member's data is copied out of it once. A member larger than the buffer grows
    only as its bytes arrive.

    Everything that is not a well-formed tar raises :class:`~wdsx.core.errors.ShardError`
    (see the module's docstring); a stream that ends without tar's end-of-archive block is
    reported as truncated, and only zero bytes may follow that block.
    """
    return _one_by_one(
        iter_member_lists(stream, url, start, chunk, available=available, max_member=max_member)
    )


def iter_member_lists(
    stream: Readable,
    url: str,
    start: int = 0,
    chunk: int = CHUNK,
    *,
    available: int | None = None,
    max_member: int | None = None,
) -> Generator[list[Member], None, int]:
    """The members of :func:`iter_members`, in lists: those parsed from each fill of the read
    buffer together (``itertools.chain.from_iterable`` makes them one stream again); before
    an error, the members ahead of it. Returns the offset of the end-of-archive marker."""
    return _walk(readinto_of(stream), None, url, start, chunk, available, max_member, True)


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
    return _one_by_one(
        _walk(functools.partial(read_into, read), skip, url, start, chunk, available, max_member, False)
    )
