"""Reading one shard from a cursor: the samples of a tar shard from a given byte offset and
ordinal, and single samples read back by position.

A shard's byte stream is opened at the cursor's offset (a seek, or a ranged request), so
resuming never re-reads the shard's beginning. Compressed shards (gzip, bzip2, xz) cannot start
at an offset: they are re-read from the start and the decompressed bytes before the offset are
skipped (logged once per shard).
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from wdsx.core.compression import Decompressed, DecompressionError, named_compressed, uncompressed
from wdsx.core.errors import Handler, ShardError, reraise_exception
from wdsx.core.streams import Prefixed
from wdsx.read import formats, jsonl, npy
from wdsx.read.samples import POSITION, Cursor, beyond_count, group_members, sample_starts
from wdsx.read.tar import Member, iter_member_lists, read_exact, scan_headers
from wdsx.read.tarheader import BLOCK, looks_like_header
from wdsx.sources import LocalSource, Source, SourceOptions, open_source, scheme_of
from wdsx.sources.prefetch import Prefetcher
from wdsx.state.position import Position

if TYPE_CHECKING:
    from wdsx.read.fieldsets import FieldJoin

log = logging.getLogger("wdsx")


@dataclass
class ReadSettings:
    """How members become samples, shared by the reading stages (picklable)."""

    options: SourceOptions
    handler: Handler = reraise_exception
    select_files: Callable[[str], bool] | None = None
    rename_files: Callable[[str], str] | None = None
    add_local_path: bool = False
    sha256: dict[str, str] | None = None
    """Expected SHA-256 per URL (from a manifest), checked when shards go through the cache."""
    max_member: int | None = None
    """The largest tar member accepted, in bytes; None: ``WDSX_MAX_MEMBER_BYTES``, else 16 GiB."""
    sizes: dict[str, int] | None = None
    """Recorded size in bytes per URL (from a manifest): a remote stream that goes on past it is
    an error, so a reply without an end (no ``Content-Length``) cannot be read forever."""
    index_sizes: bool = False
    """Give every sample its measures from its shard's offset index (``sample["__sizes__"]``,
    written by ``wdsx index --sizes``; see :mod:`wdsx.read.sizes`)."""
    fields: FieldJoin | None = None
    """Field sets whose fields are joined to every sample by key (:mod:`wdsx.read.fieldsets`)."""

    def expected_hash(self, url: str) -> str | None:
        return self.sha256.get(url) if self.sha256 else None

    def expected_size(self, url: str) -> int | None:
        return self.sizes.get(url) if self.sizes else None


def stream_offset(url: str, offset: int) -> int:
    """Where a shard's byte stream must be opened to reach offset ``offset`` (its start, for
    compressed shards and for ``.npy`` shards, which are read from their header)."""
    return offset if formats.seekable(url) else 0


def bytes_left(source: Source, opened_at: int) -> int | None:
    """How many bytes a source opened at ``opened_at`` still holds, when that is known: for a
    regular local file, its size. (A cache entry may still be growing, a pipe has no size.)"""
    if not isinstance(source, LocalSource) or source.local_path is None:
        return None
    try:
        status = os.stat(source.local_path)
    except OSError:
        return None
    return max(0, status.st_size - opened_at) if stat.S_ISREG(status.st_mode) else None


class _TarStream:
    """The tar byte stream of one shard, possibly compressed, starting at a tar offset.

    A shard is taken as compressed when its name says so or when its first bytes do; one that
    is compressed without saying so is found out when the bytes at a resume offset are not a
    tar header, and is then re-read from its start.
    """

    def __init__(self, url: str, offset: int, settings: ReadSettings, prefetcher: Prefetcher | None = None):
        opened_at = stream_offset(url, offset)
        sha256, size = settings.expected_hash(url), settings.expected_size(url)
        if prefetcher is not None:
            self.source = prefetcher.open(url, opened_at, sha256, size)
        else:
            self.source = open_source(url, opened_at, settings.options, sha256=sha256, size=size)
        try:
            self._position(url, offset, opened_at, settings)
        except BaseException:
            self.source.close()
            raise

    def _position(self, url: str, offset: int, opened_at: int, settings: ReadSettings) -> None:
        self.local_path = self.source.local_path
        self.available: int | None = None
        """Bytes of the tar stream from ``offset`` to its end, when known (local plain files)."""
        self.decompressed: Decompressed | None = None
        if opened_at:
            head = read_exact(self.source.read, BLOCK)
            if looks_like_header(head):
                stream: Any = Prefixed(head, self.source.read, self.source.readinto)
                self.read, self.readinto = stream.read, stream.readinto
                self.available = bytes_left(self.source, opened_at)
                return
            self.source.close()
            self.source = open_source(
                url, 0, settings.options, sha256=settings.expected_hash(url), size=settings.expected_size(url)
            )
        stream, compressed = uncompressed(self.source.read, self.source.readinto)
        self.read, self.readinto = stream.read, stream.readinto
        self.decompressed = stream if compressed else None
        if offset and not compressed:
            raise ShardError(url, offset, "no tar header at the resume offset (was the shard rewritten?)")
        if not compressed:
            self.available = bytes_left(self.source, 0)
        if offset:
            log.info("%s is compressed: reading it from the start to reach offset %d", url, offset)
            remaining = offset
            try:
                while remaining > 0:
                    skipped = len(self.read(min(remaining, 1 << 20)))
                    if not skipped:
                        raise ShardError(url, offset, "compressed shard ends before the resume offset")
                    remaining -= skipped
            except DecompressionError as exn:
                raise ShardError(url, offset - remaining, str(exn)) from exn

    def close(self) -> None:
        self.source.close()


def read_piece(
    url: str,
    cursor: Cursor,
    stop: int | None,
    settings: ReadSettings,
    extra: dict[str, Any] | None = None,
    prefetcher: Prefetcher | None = None,
    count: int | None = None,
    *,
    row_seed: int | None = None,
) -> formats.Samples:
    """Samples of one shard from ``cursor`` (offset and ordinal) up to ordinal ``stop``, in
    the shard's format (:mod:`wdsx.read.formats`): tar here, JSONL and ``.npy`` in their
    modules, with the same cursor contract. ``row_seed`` orders the rows of ``.npy`` shards
    (None: file order; other formats are always read in file order). With
    ``settings.index_sizes``, each sample also gets its measures from the shard's index."""
    kind = formats.format_of(url)
    samples: formats.Samples
    try:
        if kind == "jsonl":
            samples = jsonl.read_piece(url, cursor, stop, settings, extra, prefetcher, count)
        elif kind == "npy":
            samples = npy.read_piece(url, cursor, stop, settings, extra, prefetcher, count, row_seed)
        else:
            samples = _read_tar(url, cursor, stop, settings, extra, prefetcher, count)
    except Exception as exn:  # a shard that fails as it opens (a .npy map, say) fails where it is read
        return _failing(exn)
    if settings.fields is not None:
        from wdsx.read.fieldsets import join_fields  # imported here: that module imports this one

        samples = join_fields(url, cursor, stop, samples, settings, count)
    if not settings.index_sizes:
        return samples
    from wdsx.read.index import with_index_sizes  # imported here: the index module imports this one

    return with_index_sizes(url, samples, settings.options)


def _failing(exn: Exception) -> Generator[dict[str, Any], None, None]:
    """No samples: ``exn`` raised at the first read, where the reader's handler sees the errors
    of every shard (opening a ``.npy`` shard maps and checks it at once)."""
    yield from ()
    raise exn


def _read_tar(
    url: str,
    cursor: Cursor,
    stop: int | None,
    settings: ReadSettings,
    extra: dict[str, Any] | None = None,
    prefetcher: Prefetcher | None = None,
    count: int | None = None,
) -> Generator[dict[str, Any], None, None]:
    """Samples of one tar shard from ``cursor`` (offset and ordinal) up to ordinal ``stop``.

    A cursor whose offset is None starts at its ordinal: local shards find it by scanning
    headers, other shards are read from the start and the samples before it skipped.
    ``prefetcher`` hands over the shard if it was opened ahead of time. ``count``, when known
    (a manifest, ``counts=``), is how many samples the shard holds: a shard that ends with
    fewer, or goes on past it, is an error, not a silent loss or a silent surplus.
    """
    offset, first = cursor.offset, cursor.ordinal
    if offset is None:
        offset = _locate(url, first, settings)
        if offset is not None:
            cursor.offset = offset
    stream = _TarStream(url, offset or 0, settings, prefetcher)
    pad = bool(extra and extra.get("__pad__"))
    try:
        if settings.add_local_path and stream.local_path is not None:
            extra = {**(extra or {}), "__local_path__": stream.local_path}
        if offset is None:
            cursor.offset, cursor.ordinal = 0, 0
        parsed = iter_member_lists(
            stream,
            url,
            offset or 0,
            settings.options.chunk,
            available=stream.available,
            max_member=settings.max_member,
        )
        ended: list[int] = []
        failure: list[Exception] | None = None if settings.handler is reraise_exception else []
        watched = failure is not None or count is not None or stream.decompressed is not None
        samples = group_members(
            itertools.chain.from_iterable(
                _watched(parsed, ended, failure, stream.decompressed) if watched else parsed
            ),
            url,
            cursor,
            stop=stop if count is None or (stop is not None and stop < count) else count,
            rename_files=settings.rename_files,
            select_files=settings.select_files,
            extra=extra,
            handler=settings.handler,
        )
        if offset is None or pad:
            for sample in samples:
                if offset is None and sample[POSITION].ordinal < first:
                    continue
                if pad:
                    sample[POSITION] = sample[POSITION].as_padding()
                yield sample
        else:
            yield from samples
        if failure:
            raise failure[0]
        if count is not None and not ended and cursor.ordinal >= count:
            # grouping stopped at ``count`` at the start of one sample more
            raise beyond_count(url, cursor.offset or 0, count)
        if count is not None and ended and cursor.ordinal < count:
            raise ShardError(
                url,
                ended[0],
                f"the shard ends after {cursor.ordinal} samples, but its sample count (from its manifest "
                f"or counts=) is {count}",
            )
    finally:
        stream.close()


def _watched(
    members: Generator[list[Member], None, int],
    ended: list[int],
    failure: list[Exception] | None,
    compressed: Decompressed | None,
) -> Iterator[list[Member]]:
    """Pass lists of members through and note where the archive ended. With ``failure`` (a continuing
    handler), a read error ends the members and is kept there, so that the sample being
    grouped is still delivered before the error reaches the handler."""
    try:
        ended.append((yield from members))
    except Exception as exn:
        error = _in_compressed(exn, compressed)
        if failure is not None:
            failure.append(error)
        elif error is exn:
            raise
        else:
            raise error from exn


def _in_compressed(error: Exception, compressed: Decompressed | None) -> Exception:
    """A tar error found inside a compressed stream (damage that decompressed into garbage),
    also saying how far into the compressed bytes the reader was."""
    if compressed is None or not isinstance(error, ShardError) or error.reason is None:
        return error
    if "compressed byte offset" in error.reason:
        return error
    where = (
        f"{error.reason} (in {compressed.kind} data read up to compressed byte offset {compressed.position})"
    )
    # of the error's own kind (a TrailingDataError stays one), where it is built as ShardError is
    kind = type(error) if type(error).__init__ is ShardError.__init__ else ShardError
    return kind(error.url or "", error.offset, where, error.member)


def _locate(url: str, ordinal: int, settings: ReadSettings) -> int | None:
    """Byte offset of sample ``ordinal`` in a local, uncompressed shard, found by a header
    scan that seeks over payloads; None when the shard is remote or compressed (the caller
    then reads from the start and skips)."""
    if ordinal == 0:
        return 0
    if named_compressed(url):
        return None
    with open_source(url, 0, settings.options) as source:
        stream, compressed = uncompressed(source.read)
        if source.local_path is None or compressed:
            return None
        headers = scan_headers(
            stream.read, source.skip, url, available=bytes_left(source, 0), max_member=settings.max_member
        )
        for found, offset in sample_starts(headers, settings.rename_files, settings.select_files):
            if found == ordinal:
                return offset
    raise ShardError(url, None, f"shard has fewer than {ordinal + 1} samples")


def read_positions(positions: Sequence[Position], settings: ReadSettings) -> list[dict[str, Any]]:
    """Read the samples at ``positions``, in that order (padding positions give samples
    marked ``__pad__``): rows of ``.npy`` shards directly, samples of other shards in passes
    over them (:func:`_read_in_passes`)."""
    groups: dict[Callable, list[int]] = {}
    for index, position in enumerate(positions):
        read = npy.read_positions if formats.format_of(position.url) == "npy" else _read_in_passes
        groups.setdefault(read, []).append(index)
    samples: list[Any] = [None] * len(positions)
    for read, indices in groups.items():
        for index, sample in zip(indices, read([positions[i] for i in indices], settings)):
            samples[index] = sample
    return samples


def _read_in_passes(positions: Sequence[Position], settings: ReadSettings) -> list[dict[str, Any]]:
    """The samples at ``positions``, in that order.

    Positions in one shard are read in one forward pass, reopening the shard only to jump
    a long gap, so refilling a large buffer costs about one read per shard, not per sample.
    """
    wanted: dict[str, list[tuple[int, int, bool, int]]] = {}
    for index, position in enumerate(positions):
        wanted.setdefault(position.url, []).append((position.offset, position.ordinal, position.pad, index))
    samples: list[Any] = [None] * len(positions)
    for url, targets in wanted.items():
        targets.sort()
        gap = settings.options.chunk * (1 if scheme_of(url) == "file" else 8)
        next_target = 0
        while next_target < len(targets):
            offset, ordinal = targets[next_target][:2]
            progressed = False
            with closing(read_piece(url, Cursor(offset, ordinal), None, settings)) as shard:
                for sample in shard:
                    found = sample[POSITION].offset
                    if found > targets[next_target][0]:
                        break  # no sample started at the wanted offset
                    while next_target < len(targets) and targets[next_target][0] == found:
                        pad, index = targets[next_target][2:]
                        samples[index] = _as_padding(sample) if pad else dict(sample)
                        next_target += 1
                        progressed = True
                    if next_target == len(targets) or targets[next_target][0] - found > gap:
                        break
            if not progressed:
                raise ShardError(url, offset, "no sample starts at this offset (restoring a buffer)")
    return samples


def _as_padding(sample: dict[str, Any]) -> dict[str, Any]:
    """A copy of a sample marked as read a second time to even out shares."""
    return {**sample, "__pad__": True, POSITION: sample[POSITION].as_padding()}
