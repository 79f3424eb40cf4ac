"""JSONL shards: one sample per line, positioned by the byte offset of the line.

A shard named ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.bz2``, ``*.jsonl.xz`` or ``*.jsonl.zst``
holds one JSON value per line. Its
samples are ``{"__key__": "<shard stem>/<line index>", "__url__": url, "json": <parsed value>,
"__position__": (url, byte offset of the line, line index)}`` (line indices count from 0; error
messages give 1-based line numbers, as editors show them). Every line is a sample, so a
sample's ordinal is its line index, and counts are line counts; a blank line is a bad line.
The last line may lack its newline.

Plain shards are opened at the cursor's byte offset (a seek, or a ``Range:`` request), so
resuming costs the same at any depth. Compressed shards cannot start at an offset: they are
decompressed from the start and the bytes before the offset are skipped (logged). Offsets in
a compressed shard count decompressed bytes.

A line that is not valid JSON, nested deeper than Python's parser recurses, or longer than
``WDSX_MAX_LINE_BYTES`` (64 MiB; see :mod:`wdsx.core.limits`), is an error naming the shard,
the line and its byte offset; a continuing handler (``handler=warn_and_continue``) skips just
that line. A long line is never
held whole: its bytes are dropped as they pass the limit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from typing import IO, TYPE_CHECKING, Any, cast

import numpy as np

from wdsx.core.compression import DecompressionError, uncompressed
from wdsx.core.errors import ShardError
from wdsx.core.extras import install_hint
from wdsx.core.jsontext import parse_json
from wdsx.core.limits import MAX_LINE, max_line_bytes
from wdsx.core.streams import Prefixed
from wdsx.read.formats import seekable, shard_stem, with_extra
from wdsx.read.samples import POSITION, Cursor, StreamStopped, beyond_count
from wdsx.sources import Source, SourceOptions, open_source, scheme_of
from wdsx.state.position import make_position

if TYPE_CHECKING:
    from wdsx.read.shard import ReadSettings
    from wdsx.sources.prefetch import Prefetcher

log = logging.getLogger("wdsx")

SCAN_CHUNK = 4 << 20
"""Bytes per read when counting or indexing lines."""


def decompressed(
    url: str, read: Callable[[int], bytes], readinto: Callable[[memoryview], int] | None = None
) -> Callable[[int], bytes]:
    """``read`` of the shard's line bytes from its file bytes (``read``): those themselves for
    plain shards, else their decompressed stream (``.zst``, or gzip, bzip2 and xz, told by
    their first bytes), whose damage is reported as a :class:`ShardError`."""
    if seekable(url):
        return read
    errors: tuple[type[Exception], ...]
    if url.split("?", 1)[0].endswith(".zst"):
        try:
            import zstandard
        except ImportError as exn:
            hint = install_hint("zstd", "zstandard")
            raise ShardError(url, 0, f"reading .zst shards needs zstandard: {hint}") from exn
        raw = cast(IO[bytes], Prefixed(b"", read, readinto))
        stream: Any = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        errors = (zstandard.ZstdError,)
    else:
        stream, _ = uncompressed(read, readinto)
        errors = (DecompressionError,)

    delivered = 0  # decompressed bytes handed out: where the lines' byte offsets point

    def read_decompressed(n: int) -> bytes:
        nonlocal delivered
        try:
            data = stream.read(n)
        except errors as exn:
            reason = f"cannot decompress the shard past its first {delivered} bytes of lines: {exn}"
            raise ShardError(url, delivered, reason) from exn
        delivered += len(data)
        return data

    return read_decompressed


def open_lines(
    url: str,
    offset: int,
    options: SourceOptions,
    sha256: str | None = None,
    prefetcher: Prefetcher | None = None,
    size: int | None = None,
) -> tuple[Source, Callable[[int], bytes]]:
    """The shard opened so that the first line byte read is the one at ``offset``: a seek or
    a ranged request for plain shards, decompression from the start for compressed ones
    (``size``: the shard's recorded size, which a remote stream may not go past)."""
    opened_at = offset if seekable(url) else 0
    if prefetcher is not None:
        source = prefetcher.open(url, opened_at, sha256, size)
    else:
        source = open_source(url, opened_at, options, sha256=sha256, size=size)
    try:
        read = decompressed(url, source.read, source.readinto)
        if offset > opened_at:
            log.info("%s is compressed: reading it from the start to reach offset %d", url, offset)
            left = offset
            while left > 0:
                skipped = len(read(min(left, 1 << 20)))
                if not skipped:
                    raise ShardError(url, offset, "the shard ends before the resume offset")
                left -= skipped
    except BaseException:
        source.close()
        raise
    return source, read


class Overlong:
    """A line longer than the limit, in place of its bytes (which are never held whole):
    ``len()`` gives its length."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


Line = bytes | Overlong


def lines(
    read: Callable[[int], bytes], offset: int, chunk: int, limit: int | None = None
) -> Iterator[tuple[int, Line, bool]]:
    """``(byte offset, line without its newline, whether a newline ended it)`` for each line
    of the stream, which starts at byte ``offset``. A line longer than ``limit`` bytes
    (default: ``WDSX_MAX_LINE_BYTES``) comes as an :class:`Overlong`, read through without
    being kept. A line spread over many reads is joined once, at its end."""
    limit = max_line_bytes() if limit is None else limit
    pending: list[bytes] = []  # the pieces of the line being read, unless it is overlong
    size = 0  # the length of the line being read
    while data := read(chunk):
        newline = data.find(b"\n")
        if newline < 0:
            size += len(data)
            if size <= limit:
                pending.append(data)
            else:
                pending.clear()
            continue
        size += newline
        first: Line = b"".join([*pending, data[:newline]]) if size <= limit else Overlong(size)
        yield offset, first, True
        offset += size + 1
        parts = data[newline + 1 :].split(b"\n")
        tail = parts.pop()
        for line in parts:
            yield offset, line if len(line) <= limit else Overlong(len(line)), True
            offset += len(line) + 1
        size = len(tail)
        pending = [tail] if size <= limit else []
    if size:
        yield offset, b"".join(pending) if size <= limit else Overlong(size), False


def _bad_line(url: str, offset: int, index: int, line: bytes, ended: bool, exn: ValueError) -> ShardError:
    """The error for line ``index`` (from 0) that is not valid JSON."""
    what = "is empty" if not line.strip() else f"is not valid JSON ({getattr(exn, 'msg', exn)})"
    if not ended:
        what += "; it is the last line and has no newline (truncated shard?)"
    return ShardError(url, offset, f"line {index + 1} {what}")


def line_sample(url: str, stem: str, offset: int, index: int, line: Line, ended: bool) -> dict[str, Any]:
    """The sample of line ``index`` (from 0), which starts at byte ``offset`` (``ended``: a
    newline ended it); a :class:`ShardError` naming the shard, line and offset when the line
    is not valid JSON or is over the length limit."""
    if isinstance(line, Overlong):
        raise ShardError(
            url,
            offset,
            f"line {index + 1} is {line.size} bytes long, more than the limit of {max_line_bytes()} "
            f"({MAX_LINE}); raise it if such lines are expected",
        )
    try:
        value = parse_json(line)
    except ValueError as exn:
        raise _bad_line(url, offset, index, line, ended, exn) from None
    sample = {"__key__": f"{stem}/{index}", "__url__": url, "json": value}
    sample[POSITION] = make_position(url, offset, index)
    return sample


def read_piece(
    url: str,
    cursor: Cursor,
    stop: int | None,
    settings: ReadSettings,
    extra: dict[str, Any] | None = None,
    prefetcher: Prefetcher | None = None,
    count: int | None = None,
) -> Generator[dict[str, Any], None, None]:
    """The samples of a JSONL shard from ``cursor`` (byte offset and line index) up to line
    ``stop``, leaving the cursor at the next line. A cursor without an offset starts at its
    line index: found by a scan of a local plain shard, else by reading from the start.
    ``count`` (from a manifest): a shard with fewer or more lines is an error."""
    first = cursor.ordinal
    if cursor.offset is None:
        cursor.offset = locate(url, first, settings.options)
        if cursor.offset is None:
            cursor.offset, cursor.ordinal = 0, 0
    source, read = open_lines(
        url,
        cursor.offset,
        settings.options,
        settings.expected_hash(url),
        prefetcher,
        size=settings.expected_size(url),
    )
    try:
        if settings.add_local_path and source.local_path is not None:
            extra = {**(extra or {}), "__local_path__": source.local_path}
        stem, handler = shard_stem(url), settings.handler
        index = cursor.ordinal
        if stop is not None and index >= stop:
            cursor.done = True
            return
        for offset, line, ended in lines(read, cursor.offset, settings.options.chunk):
            if count is not None and index >= count:
                raise beyond_count(url, offset, count, "lines")
            cursor.offset, cursor.ordinal = offset + len(line) + ended, index + 1
            last = stop is not None and index + 1 >= stop
            cursor.done = last
            if index >= first:
                try:
                    sample = line_sample(url, stem, offset, index, line, ended)
                except ShardError as error:
                    if not handler(error):
                        raise StreamStopped from error
                else:
                    yield with_extra(sample, extra)
            if last:
                return
            index += 1
        cursor.done = True
        if count is not None and index < count:
            raise ShardError(
                url,
                cursor.offset,
                f"the shard ends after {index} lines, but its sample count (from its manifest or "
                f"counts=) is {count}",
            )
    finally:
        source.close()


def _newlines(data: bytes) -> np.ndarray:
    """Indices of the newlines in ``data``."""
    return np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)


def line_offsets(url: str, read: Callable[[int], bytes]) -> np.ndarray:
    """The byte offset of every line of the stream, and after them its length: ``n + 1``
    values for ``n`` lines (the extent of line ``i`` is ``[offsets[i], offsets[i + 1])``)."""
    starts = [np.zeros(1, dtype=np.int64)]
    size = 0
    last = b"\n"
    while data := read(SCAN_CHUNK):
        starts.append(_newlines(data).astype(np.int64) + size + 1)
        size += len(data)
        last = data[-1:]
    offsets = np.concatenate(starts)
    if last != b"\n":  # the last line has no newline: it ends at the end of the stream
        offsets = np.append(offsets, size)
    return offsets


def count_lines(url: str, read: Callable[[int], bytes]) -> int:
    """The number of lines (samples) of the stream: its newlines, plus one for a last line
    without a newline."""
    count = 0
    last = b"\n"
    while data := read(SCAN_CHUNK):
        count += data.count(b"\n")
        last = data[-1:]
    return count + (last != b"\n")


def locate(url: str, index: int, options: SourceOptions) -> int | None:
    """Byte offset of line ``index`` of a local plain shard (its end for one past the last
    line), by counting newlines; None when the shard is remote or compressed (the caller then
    reads from the start instead)."""
    if index == 0:
        return 0
    if not seekable(url) or scheme_of(url) != "file":
        return None
    with open_source(url, 0, options) as source:
        seen = size = 0
        last = b"\n"
        while data := source.read(SCAN_CHUNK):
            newlines = _newlines(data)
            if seen + len(newlines) >= index:
                return size + int(newlines[index - seen - 1]) + 1
            seen += len(newlines)
            size += len(data)
            last = data[-1:]
    if index == seen + (last != b"\n"):  # just past a last line without a newline
        return size
    raise ShardError(url, None, f"shard has fewer than {index + 1} lines")
