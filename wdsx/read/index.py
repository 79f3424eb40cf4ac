"""Offset indexes: where each sample of a shard starts and ends, so that one sample can be read
alone (a seek, or one ranged request for exactly its bytes).

An index is a small JSON file beside its shard, ``<shard>.idx`` (``train-000003.tar.idx``),
written by ``wdsx index``::

    {"format": "wdsx-offsets", "version": 1, "shard": "train-000003.tar", "samples": n,
     "dtype": "<u2", "offsets": "<base64 of the zlib-compressed differences>"}

The offsets are ``n + 1`` numbers: sample ``i`` of the shard spans bytes ``[offsets[i],
offsets[i + 1])`` — its tar members (the last sample ends where the end-of-archive marker
starts), or its JSONL line with the newline. Samples follow the readers' grouping exactly, so
ordinal ``i`` here is ordinal ``i`` of a streaming read. Stored as differences in the
narrowest integer type and compressed, an index takes about one to two bytes per sample.

Only uncompressed tar and JSONL shards can be indexed: a compressed stream cannot be entered
at an offset. ``.npy`` shards need no index: their header says where every row is.

``wdsx index --sizes`` also records each sample's measures (image widths and heights, list
lengths: :mod:`wdsx.read.sizes`) under an optional key, one packed column per measure, the
value ``-1`` where a sample lacks it::

    "sizes": {"jpg.height": {"dtype": "<u2", "values": "<base64 of the zlib-compressed numbers>"},
              "jpg.width": {...}}

The key is optional, so the version stays 1: an index without it loads as before (with no
sizes), and a wdsx that predates sizes reads the offsets of an index that has them.
A reader asked for sizes finds a sample's row by the byte offset it starts at
(:func:`with_index_sizes`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zlib
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wdsx.core.compression import uncompressed
from wdsx.core.errors import ShardError
from wdsx.core.jsontext import parse_json
from wdsx.core.redact import redact
from wdsx.read import formats
from wdsx.read.jsonl import line_offsets
from wdsx.read.manifest import read_if_present, shard_name
from wdsx.read.samples import POSITION, Cursor, sample_starts
from wdsx.read.shard import ReadSettings, bytes_left, read_piece
from wdsx.read.sizes import SIZES, columns, measure_sample, row
from wdsx.read.tar import scan_headers
from wdsx.sources import DEFAULT_OPTIONS, SourceOptions, open_sink, open_source, rewrite_url, scheme_of
from wdsx.sources.local import local_path
from wdsx.sources.urls import without_query

FORMAT = "wdsx-offsets"
VERSION = 1
SUFFIX = ".idx"
DEFAULT_LIMIT = DEFAULT_OPTIONS.max_companion_bytes


def index_url(url: str) -> str:
    """Where the offset index of the shard at ``url`` lives: beside it, ``<shard>.idx``, at
    the shard's path without its query (a presigned URL's signature covers the shard only).
    A ``pipe:`` shard has none: appending to its command would run a command nobody wrote."""
    if url.startswith("pipe:"):
        raise ValueError(f"{redact(url)}: a pipe: shard has no offset index beside it")
    return without_query(url) + SUFFIX


class NotIndexableError(ValueError):
    """A shard that has no offsets to index: a compressed stream cannot be entered at a sample."""


def check_indexable(url: str, compressed: bool = False) -> None:
    """Raise a :class:`NotIndexableError` saying why the shard at ``url`` cannot be read
    sample by sample, if it cannot: a compressed shard (by its name, or ``compressed``: by its
    content) has no offsets to seek to."""
    if compressed or (formats.format_of(url) != "npy" and not formats.seekable(url)):
        raise NotIndexableError(
            f"{url}: random access needs uncompressed shards (a compressed stream cannot be entered "
            "at a sample's offset); decompress it (e.g. gunzip) and index it with `wdsx index`"
        )


@dataclass(frozen=True)
class ShardIndex:
    """Where each sample of one shard starts, and where the last one ends; with ``--sizes``,
    each sample's measures too."""

    name: str
    """The shard's basename."""
    offsets: np.ndarray
    """``samples + 1`` byte offsets: sample ``i`` spans ``[offsets[i], offsets[i + 1])``."""
    sizes: dict[str, np.ndarray] | None = None
    """One column of ``samples`` numbers per measure (``-1``: absent); None when the index was
    written without ``--sizes``."""
    shard_bytes: int | None = None
    """The size of the shard it was made from, where known (a local shard)."""
    shard_ends: str | None = None
    """A hash of that shard's first and last bytes (:func:`shard_ends`): with the size, what
    tells the shard the index was made from from one rewritten in its place since (a
    rewritten tar shard often keeps its size, padded to whole 10240-byte records; a copy
    that keeps the bytes keeps the index)."""

    @property
    def samples(self) -> int:
        """How many samples the shard holds."""
        return len(self.offsets) - 1

    def extent(self, ordinal: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of sample ``ordinal``."""
        return int(self.offsets[ordinal]), int(self.offsets[ordinal + 1])

    def sizes_at(self, offset: int) -> dict[str, int]:
        """The measures of the sample that holds byte ``offset`` (where a reader says it starts:
        its first member that was not skipped). A ValueError when the index has no sizes or no
        sample holds that byte."""
        if self.sizes is None:
            raise ValueError("its offset index has no sizes: write them with `wdsx index --sizes`")
        ordinal = int(np.searchsorted(self.offsets, offset, side="right")) - 1
        if not 0 <= ordinal < self.samples:
            raise ValueError(f"no sample of its offset index holds byte {offset} (was the shard rewritten?)")
        return row(self.sizes, ordinal)

    def to_json(self) -> str:
        """The index as one line of JSON (see the module's docstring)."""
        kind, packed = _pack(np.diff(self.offsets, prepend=0))
        record: dict[str, Any] = {"format": FORMAT, "version": VERSION, "shard": self.name}
        record |= {"samples": self.samples, "dtype": kind, "offsets": packed}
        if self.shard_bytes is not None:
            record["bytes"] = self.shard_bytes
        if self.shard_ends is not None:
            record["ends"] = self.shard_ends
        if self.sizes is not None:
            record["sizes"] = {
                name: dict(zip(("dtype", "values"), _pack(column))) for name, column in self.sizes.items()
            }
        return json.dumps(record) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, url: str = "", limit: int = DEFAULT_LIMIT) -> ShardIndex:
        """Parse an index; ValueError naming ``url`` when it is not one or is damaged.

        The numbers are inflated only as far as the samples it claims need, and held as 8-byte
        numbers: an index claiming more than ``limit // 8`` of them (offsets and sizes together)
        is refused (a small compressed string could otherwise claim, and inflate to, any size)."""
        try:
            data = parse_json(text)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise ValueError(f'not a wdsx offset index (missing "format": "{FORMAT}")')
            if data.get("version") != VERSION:
                raise ValueError(f"unsupported offset index version {data.get('version')!r}")
            offsets = _offsets(data, limit)
            sizes = _sizes(data, limit - 8 * len(offsets))
            shard_bytes, ends = data.get("bytes"), data.get("ends")
            if shard_bytes is not None and (type(shard_bytes) is not int or shard_bytes < 0):
                raise ValueError(f"its shard size {shard_bytes!r} is not a byte count")
            if ends is not None and not isinstance(ends, str):
                raise ValueError(f"its shard hash {ends!r} is not text")
        except (ValueError, KeyError, TypeError, zlib.error) as exn:
            raise ValueError(f"{url}: {exn}") from exn
        return cls(str(data["shard"]), offsets, sizes, shard_bytes, ends)

    def write(self, url: str, options: SourceOptions | None = None) -> None:
        """Write this index beside the shard at ``url``."""
        with open_sink(index_url(url), options) as sink:
            sink.write(self.to_json().encode("utf-8"))


def _pack(values: np.ndarray) -> tuple[str, str]:
    """Integers as their narrowest little-endian type and the base64 of their zlib-compressed
    bytes."""
    low, high = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    kind = np.result_type(np.min_scalar_type(low), np.min_scalar_type(high)).newbyteorder("<")
    return kind.str, base64.b64encode(zlib.compress(values.astype(kind).tobytes(), 9)).decode("ascii")


def _unpack(kind_name: str, packed: str, count: int, what: str, samples: int) -> np.ndarray:
    """The ``count`` integers (for ``samples`` samples) that :func:`_pack` packed, inflating
    no more than they need."""
    kind = np.dtype(kind_name)
    if kind.kind not in "iu":
        raise ValueError(f"{what} of type {kind.str!r}, not integers")
    size = count * kind.itemsize
    inflater = zlib.decompressobj()
    raw = inflater.decompress(base64.b64decode(packed, validate=True), size + 1)
    if len(raw) != size or inflater.unconsumed_tail or not inflater.eof:
        raise ValueError(f"its {what} are not the {count} numbers of {samples} samples")
    return np.frombuffer(raw, kind)


def _offsets(data: dict[str, Any], limit: int) -> np.ndarray:
    """The ``samples + 1`` offsets of a parsed index, from their packed differences."""
    count = int(data["samples"]) + 1
    if not 0 < count <= limit // 8:
        raise ValueError(
            f"it claims {count - 1} samples, more than {limit // 8 - 1} (a limit of {limit} bytes of "
            "offsets: SourceOptions.max_companion_bytes)"
            if count > 0
            else f"it claims {count - 1} samples"
        )
    deltas = _unpack(data["dtype"], data["offsets"], count, "offsets", count - 1)
    return np.cumsum(deltas, dtype=np.int64)


def _sizes(data: dict[str, Any], limit: int) -> dict[str, np.ndarray] | None:
    """The measure columns of a parsed index (None when it has none), within ``limit`` bytes
    held as 8-byte numbers."""
    if "sizes" not in data:
        return None
    found, count = data["sizes"], int(data["samples"])
    if not isinstance(found, dict):
        raise ValueError('its "sizes" are not an object of columns')
    if len(found) * count > limit // 8:
        raise ValueError(f"its {len(found)} size columns of {count} samples exceed {limit} bytes")
    sizes = {}
    for name, column in found.items():
        values = _unpack(column["dtype"], column["values"], count, f"sizes {name!r}", count)
        sizes[str(name)] = values.astype(np.int64)
    return sizes


def load_index(url: str, options: SourceOptions | None = None) -> ShardIndex | None:
    """The index written beside the shard at ``url``, or None when there is none. An index
    made from another local shard of that name (of another size, or other first or last
    bytes) is a :class:`ShardError`: the shard was rewritten since."""
    target = index_url(url)
    text = read_if_present(target, options)
    limit = (options or DEFAULT_OPTIONS).max_companion_bytes
    if text is None:
        return None
    index = ShardIndex.from_json(text, target, limit)
    path = local_path(rewrite_url(url))
    if path is None or index.shard_bytes is None:
        return index  # a remote shard, or an index written before indexes recorded their shard
    try:
        now = (os.path.getsize(path), shard_ends(path) if index.shard_ends is not None else None)
    except OSError:
        return index  # reading the shard itself will say what is wrong with it
    if now != (index.shard_bytes, index.shard_ends):
        raise ShardError(
            url,
            None,
            f"its offset index {target} describes the shard as it was (its size, or its first or last "
            "bytes, differ now): the shard was rewritten since; write its index again with `wdsx index`",
        )
    return index


ENDS = 1 << 16
"""Bytes hashed at each end of a shard for :attr:`ShardIndex.shard_ends`."""


def shard_ends(path: str) -> str:
    """A hash of the first and last :data:`ENDS` bytes of the local file at ``path`` (of all of
    it when smaller): two reads however big the shard."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        digest.update(file.read(ENDS))
        if size > ENDS:
            file.seek(max(ENDS, size - ENDS))
            digest.update(file.read(ENDS))
    return digest.hexdigest()[:32]


def _ending(
    headers: Generator[tuple[str, int, int], None, int], end: list[int]
) -> Iterator[tuple[str, int, int]]:
    """The header records, and the end-of-archive offset the scan returns, into ``end``."""
    end.append((yield from headers))


def scan_index(
    url: str, options: SourceOptions | None = None, *, sizes: bool = False, list_fields: Sequence[str] = ()
) -> ShardIndex:
    """Build the index of the shard at ``url`` by reading it: a local tar shard header by
    header (seeking over payloads), a JSONL shard line by line; remote shards are streamed.
    A shard that turns out to be compressed is refused (a ValueError). With ``sizes``, the
    shard is read a second time, whole, to measure every sample (:func:`scan_sizes`)."""
    check_indexable(url)
    with open_source(url, 0, options) as source:
        stream, compressed = uncompressed(source.read, source.readinto)
        check_indexable(url, compressed)
        if formats.format_of(url) == "jsonl":
            offsets = line_offsets(url, stream.read)
        else:
            skip = source.skip if source.local_path else None
            end: list[int] = []
            headers = scan_headers(stream.read, skip, url, available=bytes_left(source, 0))
            starts = [offset for _, offset in sample_starts(_ending(headers, end))]
            offsets = np.array([*starts, end[0]], dtype=np.int64)
    measured = scan_sizes(url, len(offsets) - 1, options, list_fields) if sizes else None
    path = local_path(rewrite_url(url))
    if path is None:
        return ShardIndex(shard_name(url), offsets, measured)
    return ShardIndex(shard_name(url), offsets, measured, os.path.getsize(path), shard_ends(path))


def scan_sizes(
    url: str, samples: int, options: SourceOptions | None = None, list_fields: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """The measure columns of the ``samples`` samples of the shard at ``url``, read in order
    as a pipeline reads them. A ValueError names the shard and the sample that cannot be
    measured."""
    settings = ReadSettings(options or DEFAULT_OPTIONS)
    measured = []
    for sample in read_piece(url, Cursor(0, 0), None, settings):
        try:
            measured.append(measure_sample(sample, list_fields))
        except ValueError as exn:
            raise ValueError(f"{url}: {exn}") from exn
    if len(measured) != samples:
        raise ValueError(f"{url}: {len(measured)} samples read, but its headers show {samples}")
    return columns(measured)


def with_index_sizes(
    url: str, samples: formats.Samples, options: SourceOptions | None = None
) -> Generator[dict[str, Any], None, None]:
    """``samples`` of the shard at ``url``, each given its measures from the shard's index as
    :data:`~wdsx.read.sizes.SIZES` (the index is loaded at the first sample). A sample's
    measures depend only on where it starts in the shard, so a sample read again when a
    checkpoint is resumed gets the same ones."""
    try:
        if formats.format_of(url) == "npy":
            raise ShardError(url, None, "sizes come from an offset index, and .npy shards have none")
        index = load_index(url, options)
        if index is None:
            raise ShardError(
                url, None, f"no offset index {index_url(url)}: write one with `wdsx index --sizes`"
            )
        for sample in samples:
            try:
                sample[SIZES] = index.sizes_at(sample[POSITION].offset)
            except ValueError as exn:
                raise ShardError(url, sample[POSITION].offset, str(exn)) from None
            yield sample
    finally:
        samples.close()


def shard_index(url: str, options: SourceOptions | None = None) -> ShardIndex:
    """The index of the shard at ``url``: its ``.idx`` file, else (local shards only) a scan.
    A remote shard without an index is an error that says how to make one."""
    found = load_index(url, options)
    if found is not None:
        return found
    check_indexable(url)
    if scheme_of(url) != "file":
        raise ShardError(
            url, None, f"no offset index {index_url(url)} for random access: write one with `wdsx index`"
        )
    return scan_index(url, options)
