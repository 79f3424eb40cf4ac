"""``.npy`` shards: one sample per row of an array saved with ``np.save``.

A shard ``feats-003.npy`` holding an array of shape ``(n, *rest)`` has ``n`` samples
``{"__key__": "feats-003/<row>", "__url__": url, "npy": <row, an array of shape rest>,
"__position__": ...}``. The count comes from the header, so dealing an epoch never reads data.
Local shards are memory-mapped; remote ones are read whole into memory when streamed, and row
by row (one ranged request each) for random access.

**Order and cursor.** When shards are shuffled, each shard's rows are read in a random order
that changes every epoch: a permutation that is a pure function of (seed, epoch, shard URL),
so every rank, worker and restart computes the same one. A sample's position is (URL, row
index, ordinal, padding flag), where the ordinal is the sample's place in that order. So the
cursor of a reader is an ordinal — the deal, its spans, exact and elastic resume work on
ordinals exactly as for tar shards — and reading a position back needs no permutation: the
row index says which row. Without shuffling the order is the file's, and ordinal = row.
"""

from __future__ import annotations

import ast
import functools
import io
import logging
import math
import mmap
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsx.core import allocate, rng
from wdsx.core.astlock import AST_LOCK
from wdsx.core.errors import ShardError
from wdsx.read.formats import format_of, shard_stem, with_extra
from wdsx.read.rows import RowKeys, RowPositions, RowSource, join_columns
from wdsx.read.samples import POSITION, Cursor, beyond_count
from wdsx.read.tar import read_exact
from wdsx.sources import LocalSource, Source, SourceOptions, local_path, open_source, rewrite_url
from wdsx.state.position import Position, make_position

if TYPE_CHECKING:
    from wdsx.read.shard import ReadSettings
    from wdsx.sources.prefetch import Prefetcher

log = logging.getLogger("wdsx")

MAGIC = b"\x93NUMPY"
VERSIONS = ((1, 0), (2, 0), (3, 0))
"""The format versions of ``.npy`` files (numpy reads no others)."""
MAX_HEADER = 1 << 16
"""The longest ``.npy`` header accepted, in bytes (numpy's own default is 10000; a structured
dtype of many fields may need more, no array needs 64 KiB)."""
READ_CHUNK = 1 << 22


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header says: the dtype, the shape, and where the data starts."""

    dtype: np.dtype
    shape: tuple[int, ...]
    data_offset: int

    @property
    def rows(self) -> int:
        """How many rows (samples) the array has."""
        return self.shape[0]

    @property
    def row_bytes(self) -> int:
        """The size of one row's data."""
        return self.dtype.itemsize * math.prod(self.shape[1:])

    @property
    def data_bytes(self) -> int:
        """The size of all the rows' data, after the header."""
        return self.rows * self.row_bytes


def parse_header(url: str, read: Callable[[int], bytes]) -> NpyHeader:
    """The header at the start of a ``.npy`` stream; the stream is left at the first data byte.
    Arrays without rows to read one by one (0-d, object dtype, Fortran order, rows of no
    bytes) are refused, and so are headers longer than :data:`MAX_HEADER` and negative
    dimensions, each with a :class:`ShardError` naming the shard and the header's offset."""
    head = read_exact(read, 10)
    if not head.startswith(MAGIC) or len(head) < 10:
        raise ShardError(url, 0, "not a .npy file (no NUMPY magic)")
    if (head[6], head[7]) not in VERSIONS:
        raise ShardError(url, 6, f".npy format version {head[6]}.{head[7]} is not one numpy writes")
    if head[6] >= 2:
        head += read_exact(read, 2)
        length = int.from_bytes(head[8:12], "little")
    else:
        length = int.from_bytes(head[8:10], "little")
    if length > MAX_HEADER:
        raise ShardError(
            url, 8, f"the .npy header claims {length} bytes, more than the {MAX_HEADER} accepted"
        )
    text = read_exact(read, length)
    if len(text) < length:
        raise ShardError(url, len(head) + len(text), "the .npy header is truncated")
    try:
        shape, fortran, dtype = _header_fields(head, text)
    except Exception as exn:  # numpy's parser of the header's text raises many kinds of errors
        raise ShardError(url, 0, f"not a readable .npy header: {type(exn).__name__}: {exn}") from exn
    if not shape:
        raise ShardError(url, 0, "the .npy array is 0-dimensional: it has no rows")
    if dtype.hasobject:
        raise ShardError(url, 0, "the .npy array holds Python objects (pickles), which wdsx does not load")
    if dtype.subdtype is not None:
        raise ShardError(
            url, 0, f"the .npy header's dtype {dtype} is a subarray type, which np.save never writes"
        )
    if fortran and len(shape) > 1:
        raise ShardError(
            url, 0, "the .npy array is in Fortran order, so its rows are not contiguous: save it in C order"
        )
    header = NpyHeader(dtype, tuple(shape), len(head) + length)
    if min(shape) < 0:
        raise ShardError(url, 0, f"the .npy header gives a negative dimension: shape {shape}")
    if header.row_bytes == 0 and header.rows:
        raise ShardError(url, 0, f"the .npy rows hold no data (shape {shape}, itemsize {dtype.itemsize})")
    return header


@functools.lru_cache(maxsize=64)
def _header_fields(head: bytes, text: bytes) -> tuple[tuple[int, ...], bool, np.dtype]:
    """Shape, Fortran order and dtype from a header, parsed as ``np.load`` parses it: numpy's
    own readers for versions 1 and 2 (latin-1 text, old Python 2 headers repaired), and for
    version 3 the UTF-8 text as a Python literal with no repair (numpy's readers of versions 1
    and 2 would read it as latin-1, renaming non-ASCII fields, and repair what numpy refuses).
    Remembered for the last 64 headers: the shards of a dataset mostly share one, and parsing
    it costs more than reading it (each shard's header is read for its count, then again)."""
    if head[6] < 3:
        stream = io.BytesIO(head + text)
        np.lib.format.read_magic(stream)
        reader = np.lib.format.read_array_header_1_0 if head[6] == 1 else np.lib.format.read_array_header_2_0
        with AST_LOCK:  # numpy parses the text with ``ast``
            return reader(stream, max_header_size=MAX_HEADER)
    with AST_LOCK:
        fields = ast.literal_eval(text.decode("utf-8"))
    if not isinstance(fields, dict) or fields.keys() != {"descr", "fortran_order", "shape"}:
        raise ValueError(f"the header is not a dict of descr, fortran_order and shape: {text[:200]!r}")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(size) is int for size in shape):
        raise ValueError(f"shape is not a tuple of integers: {shape!r}")
    if not isinstance(fortran, bool):
        raise ValueError(f"fortran_order is not a bool: {fortran!r}")
    return shape, fortran, np.lib.format.descr_to_dtype(fields["descr"])


def read_header(url: str, options: SourceOptions | None = None) -> NpyHeader:
    """The header of the ``.npy`` shard at ``url`` (one small read, or one ranged request)."""
    with open_source(url, 0, options) as source:
        return parse_header(url, source.read)


def header_counts(
    urls: Sequence[str],
    options: SourceOptions | None = None,
    handler: Callable[[Exception], Any] | None = None,
) -> list[int] | None:
    """Per-shard sample counts read from the headers when every shard is an ``.npy`` shard
    (one small read each); None otherwise. A header that cannot be read raises, or, with a
    ``handler`` that does not raise, is reported to it and counted as 0 rows: the shard is
    then skipped, or, when the handler chose to stop, ends the stream where it is read."""
    if not urls or any(format_of(url) != "npy" for url in urls):
        return None
    return [_header_rows(url, options, handler) for url in urls]


def _header_rows(url: str, options: SourceOptions | None, handler: Callable[[Exception], Any] | None) -> int:
    try:
        return read_header(url, options).rows
    except Exception as exn:  # any failure to read the header is the shard's problem
        if handler is None:
            raise
        handler(exn)
        return 0


def count_rows(url: str, read: Callable[[int], bytes]) -> int:
    """The number of samples (rows) of a ``.npy`` stream, from its header."""
    return parse_header(url, read).rows


class Rows:
    """The rows of one shard: a memory map of a local file, or the data of any other (remote,
    or a cache entry that may still be downloading) read whole into memory."""

    def __init__(self, url: str, header: NpyHeader, array: np.ndarray, local_path: str | None):
        self.url = url
        self.header = header
        self.array = array
        self.local_path = local_path

    @classmethod
    def open(
        cls,
        url: str,
        options: SourceOptions,
        sha256: str | None = None,
        prefetcher: Prefetcher | None = None,
        size: int | None = None,
    ) -> Rows:
        source = (
            prefetcher.open(url, 0, sha256, size)
            if prefetcher is not None
            else open_source(url, 0, options, sha256=sha256, size=size)
        )
        with source:
            header = parse_header(url, source.read)
            if isinstance(source, LocalSource) and source.local_path is not None:
                return cls(url, header, _mapped(url, source.fileno(), header), source.local_path)
            log.info(
                "%s is not a local file: reading its %d bytes of rows into memory", url, header.data_bytes
            )
            data = _read_data(url, source, header)
        array = np.frombuffer(data, header.dtype).reshape(header.shape)
        return cls(url, header, array, source.local_path)

    @property
    def count(self) -> int:
        """How many rows the shard has."""
        return self.header.rows

    def row(self, index: int) -> np.ndarray:
        """Row ``index`` as an array of its own (not a view that keeps the shard mapped), of the
        array's dtype: a 0-d array for a 1-D shard, never a numpy scalar, whose dtype would
        shrink (``S3`` to ``S2`` for bytes ending in NUL) and differ from a re-read row's."""
        if not 0 <= index < len(self.array):
            raise IndexError(f"{self.url} has {len(self.array)} rows, not {index + 1}")
        return self.array[index, ...].copy()


def _mapped(url: str, fileno: int, header: NpyHeader) -> np.ndarray:
    """The rows of the open local shard ``fileno``, as a read-only array over a map of it."""
    if header.data_bytes == 0:
        return np.empty(header.shape, header.dtype)
    # A plain array over the map: indexing a np.memmap costs several times more, and making
    # one costs several times what this does.
    try:
        mapped = mmap.mmap(fileno, 0, access=mmap.ACCESS_READ)
    except OSError as exn:  # a filesystem that cannot map files
        raise ShardError(url, header.data_offset, f"cannot map the shard's rows: {exn}") from exn
    count = header.data_bytes // header.dtype.itemsize
    try:
        data = np.frombuffer(mapped, header.dtype, count, header.data_offset)
    except ValueError as exn:  # the file is shorter than the header says
        raise ShardError(
            url, header.data_offset, f"the shard is shorter than its header says ({exn})"
        ) from exn
    return data.reshape(header.shape)


def _read_data(url: str, source: Source, header: NpyHeader) -> bytearray:
    """The bytes of every row. The buffer grows as they arrive: a header claiming more rows
    than the shard holds costs no memory for the rows that are not there."""
    data = bytearray()
    while len(data) < header.data_bytes:
        part = source.read(min(READ_CHUNK, header.data_bytes - len(data)))
        if not part:
            raise ShardError(
                url,
                header.data_offset + len(data),
                f"the shard ends after {len(data)} of {header.data_bytes} data bytes",
            )
        data += part
    return data


def read_row(url: str, header: NpyHeader, index: int, options: SourceOptions | None = None) -> np.ndarray:
    """Row ``index`` of a shard whose header is known, read alone: a seek, or one ranged
    request for exactly its bytes."""
    if not 0 <= index < header.rows:
        raise IndexError(f"{url} has {header.rows} rows, not {index + 1}")
    offset = header.data_offset + index * header.row_bytes
    with open_source(url, offset, options, end=offset + header.row_bytes) as source:
        data = read_exact(source.read, header.row_bytes)
    if len(data) < header.row_bytes:
        raise ShardError(url, offset, f"the shard ends inside row {index}")
    return np.frombuffer(data, header.dtype).reshape(header.shape[1:]).copy()


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


_MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB))
"""SplitMix64's finaliser, before its last step: ``x ^= x >> shift; x *= factor``, twice."""


KEPT_ROWS = 1 << 20
"""Row orders of shards of up to this many rows are computed with arrays kept between calls
(8 MiB each at most, per thread): fresh temporaries of that size cost more in page faults than
in arithmetic. Larger shards get fresh ones, whose faults weigh little beside their sort."""

_kept_arrays = threading.local()


def _kept(name: str, n: int, make: Callable[[int], np.ndarray]) -> np.ndarray:
    """The first ``n`` words of this thread's array ``name``, made anew by ``make`` when it is
    shorter, and then kept for shards of up to :data:`KEPT_ROWS` rows."""
    kept: np.ndarray | None = getattr(_kept_arrays, name, None)
    if kept is not None and len(kept) >= n:
        return kept[:n]
    made = make(n)
    if n <= KEPT_ROWS:
        setattr(_kept_arrays, name, made)
    return made


def _read_only_range(n: int) -> np.ndarray:
    counting = np.arange(n, dtype=np.uint64)
    counting.flags.writeable = False
    return counting


def _counting(n: int) -> np.ndarray:
    """``0, 1, ..., n - 1`` as a read-only uint64 array (a view of one kept)."""
    return _kept("counting", n, _read_only_range)


def _scratch_words(n: int) -> np.ndarray:
    """A uint64 array of ``n`` words to write temporaries into (kept, so reused)."""
    return _kept("scratch", n, functools.partial(np.empty, dtype=np.uint64))


def draws(seed: int, n: int) -> np.ndarray:
    """``rng.draw(seed, i)`` for ``i`` in ``range(n)``, computed as one new array (SplitMix64)
    with one temporary reused across calls: a shard's row order is computed every epoch, and
    the page faults of fresh temporaries cost more than the arithmetic."""
    shifted = _scratch_words(n)
    with np.errstate(over="ignore"):
        x = np.multiply(_counting(n), _GOLDEN)
        x += np.uint64((seed + int(_GOLDEN)) & 0xFFFFFFFFFFFFFFFF)
        for shift, factor in _MIX:
            np.right_shift(x, np.uint64(shift), out=shifted)
            x ^= shifted
            x *= np.uint64(factor)
        np.right_shift(x, np.uint64(31), out=shifted)  # the last step: ``x ^= x >> 31``
        x ^= shifted
    return x


def epoch_row_seed(seed: int, epoch: int) -> int:
    """The seed of an epoch's row orders (:func:`row_order`) for a pipeline seeded ``seed``."""
    return rng.derive_seed("rows", seed, epoch)


def row_order(rows: int, url: str, seed: int | None) -> np.ndarray | None:
    """The order in which a shard's rows are read: None for the file's order, else a random
    permutation that is a pure function of ``seed`` (the epoch's) and the shard's URL: rows
    sorted by one 64-bit random draw each. The draws of one seed are all distinct (SplitMix64
    is a bijection of its distinct inputs), so the order does not depend on the sort's
    algorithm or numpy's version."""
    if seed is None:
        return None
    row_seed = rng.derive_seed("rows", seed, url)
    order = _sorting_permutation(draws(row_seed, rows))
    return np.argsort(draws(row_seed, rows)) if order is None else order


def _sorting_permutation(keys: np.ndarray) -> np.ndarray | None:
    """``np.argsort(keys)`` for distinct uint64 ``keys``, in about half the time, or None
    where this way cannot tell (then ``keys`` are lost: they are overwritten as they are
    sorted). Each key's high bits share one word with its index in the low bits, and the
    words are sorted as values, with no indirection. Two keys whose high bits tie could be
    ordered differently from argsort's order; for 20,000 keys with 49 high bits, that
    happens about once in millions."""
    index_bits = max(1, (len(keys) - 1).bit_length())
    low = np.uint64((1 << index_bits) - 1)
    keys &= ~low
    keys |= _counting(len(keys))
    keys.sort()
    high = np.right_shift(keys, np.uint64(index_bits), out=_scratch_words(len(keys)))
    if len(high) > 1 and (high[1:] == high[:-1]).any():
        return None
    keys &= low
    return keys.view(np.int64).astype(np.intp, copy=False)  # indices are far below 2**63


def row_sample(url: str, stem: str, row: int, ordinal: int, data: np.ndarray) -> dict[str, Any]:
    """The sample of ``row``, read as the ``ordinal``-th of its shard."""
    sample = {"__key__": f"{stem}/{row}", "__url__": url, "npy": data}
    sample[POSITION] = make_position(url, row, ordinal)
    return sample


class ConstantColumns:
    """The columns of the fields that have one value on every row of a batch (the reader's
    extra fields, ``__local_path__`` and ``__pad__``, then its stamps), as
    ``default_collation_fn`` collates them: a list of the value, or an array of the number.
    The columns of one batch size and one stamps dict are built once, and each batch gets
    copies of them: a copy costs a fraction of building them, and a piece's batches all share
    both."""

    def __init__(self, fields: dict[str, Any] | None):
        self.fields = fields or {}
        self._stamps: dict[str, Any] | None = None
        self._columns: dict[int, list[tuple[str, list | np.ndarray]]] = {}

    def columns(self, size: int, stamps: dict[str, Any] | None) -> list[tuple[str, list | np.ndarray]]:
        """The fields' and ``stamps``' columns of ``size`` rows, by name (each batch copies them)."""
        if stamps is not self._stamps:  # holding ``stamps`` keeps its identity unique
            self._stamps, self._columns = stamps, {}
        columns = self._columns.get(size)
        if columns is None:
            fields = {**self.fields, **stamps} if stamps else self.fields
            columns = self._columns[size] = [
                (name, _constant_column(value, size)) for name, value in fields.items()
            ]
        return columns


def _constant_column(value: Any, size: int) -> list | np.ndarray:
    """``size`` copies of ``value`` collated: an array of a number (of its own type: True and
    1 give different arrays), else a list."""
    return np.full(size, value) if isinstance(value, (int, float)) else [value] * size


class RowPiece(RowSource):
    """The samples of ordinals ``[cursor.ordinal, stop)`` of one shard, in the epoch's row
    order, one by one (an iterator) or a whole batch at a time (:meth:`take`). The cursor
    holds the ordinal and row of the next sample."""

    def __init__(
        self,
        rows: Rows,
        order: np.ndarray | None,
        cursor: Cursor,
        stop: int | None,
        extra: dict[str, Any] | None,
    ):
        self.rows = rows
        self.order = order
        self.cursor = cursor
        self.end = rows.count if stop is None else min(stop, rows.count)
        self.extra = extra
        self.pad = bool(extra and extra.get("__pad__"))
        self.constants = ConstantColumns(extra)
        self.stem = shard_stem(rows.url)
        self.joins = True
        """Whether batches may still start with samples held before them (see :meth:`take`)."""
        self._advance(cursor.ordinal)

    def _row(self, ordinal: int) -> int:
        return ordinal if self.order is None else int(self.order[ordinal])

    def _advance(self, ordinal: int) -> None:
        cursor, order = self.cursor, self.order
        cursor.ordinal = ordinal
        # (the row of the next ordinal, as :meth:`_row` says, written out: this runs per batch)
        cursor.offset = ordinal if order is None or ordinal >= len(order) else int(order[ordinal])
        cursor.done = ordinal >= self.end

    def __iter__(self) -> RowPiece:
        return self

    def __next__(self) -> dict[str, Any]:
        ordinal = self.cursor.ordinal
        if ordinal >= self.end:
            self.cursor.done = True
            raise StopIteration
        row = self._row(ordinal)
        sample = row_sample(self.rows.url, self.stem, row, ordinal, self.rows.row(row))
        self._advance(ordinal + 1)
        return with_extra(sample, self.extra)

    def left(self) -> int:
        """How many samples the piece has left (see :class:`~wdsx.read.rows.RowSource`)."""
        return self.end - self.cursor.ordinal

    def take(
        self, size: int, head: dict[str, Any] | None = None, stamps: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], Sequence[Position]] | None:
        first = self.cursor.ordinal
        if first + size > self.end or (head is not None and not self.joins):
            return None
        batch, positions = self._builder(size, stamps)(self._rows_of(first, first + size), first)
        if head is not None:
            joined = join_columns(head, batch)
            if joined is None:
                self.joins = False
                return None
            batch, positions = joined, joined[POSITION]
        self._advance(first + size)
        return batch, positions

    def batches(
        self, size: int, stamps: dict[str, Any] | None = None
    ) -> Iterator[tuple[dict[str, Any], Sequence[Position]]]:
        first = self.cursor.ordinal
        count = (self.end - first) // size
        if count <= 0:
            return
        build = self._builder(size, stamps)
        # every batch's rows at once, as one (count, size) array whose rows are the batches
        for rows in self._rows_of(first, first + count * size).reshape(count, size):
            block = build(rows, first)
            first += size
            self._advance(first)
            yield block

    def _rows_of(self, first: int, stop: int) -> np.ndarray:
        """The rows of ordinals ``[first, stop)``."""
        return np.arange(first, stop) if self.order is None else self.order[first:stop]

    def _builder(
        self, size: int, stamps: dict[str, Any] | None
    ) -> Callable[[np.ndarray, int], tuple[dict[str, Any], RowPositions]]:
        """A function that collates the ``size`` samples of rows ``rows`` (of ordinals from
        ``first`` on) into one batch, with their positions: the rows gathered in one step,
        keys and positions as lazy columns. What every batch of a piece shares is worked out
        once here, for a piece hands out hundreds of batches."""
        array, url, stem, pad = self.rows.array, self.rows.url, self.stem, self.pad
        # (in a WebLoader worker, the batch's array lies in the shared memory it travels in)
        take, empty = array.take, allocate.maker((size, *array.shape[1:]), array.dtype)
        urls, constants = [url] * size, self.constants.columns(size, stamps)

        def build(rows: np.ndarray, first: int) -> tuple[dict[str, Any], RowPositions]:
            positions = RowPositions(url, rows, first, pad)
            batch = {
                "__key__": RowKeys(stem, rows),
                "__url__": urls.copy(),
                # rows are in range by construction; numpy would buffer ``out`` in its default
                # "raise" mode
                "npy": take(rows, axis=0, out=empty(), mode="clip"),
                POSITION: positions,
            }
            for name, column in constants:
                batch[name] = column.copy()
            return batch, positions

        return build

    def close(self) -> None:
        """Nothing to release: the rows are a memory map or bytes in memory."""


def read_piece(
    url: str,
    cursor: Cursor,
    stop: int | None,
    settings: ReadSettings,
    extra: dict[str, Any] | None = None,
    prefetcher: Prefetcher | None = None,
    count: int | None = None,
    row_seed: int | None = None,
) -> RowPiece:
    """The samples of a ``.npy`` shard from ``cursor``'s ordinal up to ``stop``, in the order
    of ``row_seed`` (None: the file's). The cursor's offset is not needed: the order says
    which row each ordinal is. ``count`` (from a manifest): a shard with fewer or more rows is an error."""
    rows = Rows.open(
        url, settings.options, settings.expected_hash(url), prefetcher, settings.expected_size(url)
    )
    if count is not None and rows.count < count:
        raise ShardError(
            url,
            0,
            f"the shard has {rows.count} rows, but its sample count (from its manifest or counts=) "
            f"is {count}",
        )
    if count is not None and rows.count > count:
        raise beyond_count(url, rows.header.data_offset + count * rows.header.row_bytes, count, "rows")
    if settings.add_local_path and rows.local_path is not None:
        extra = {**(extra or {}), "__local_path__": rows.local_path}
    return RowPiece(rows, row_order(rows.count, url, row_seed), cursor, stop, extra)


def _row_source(
    url: str, wanted: int, settings: ReadSettings
) -> tuple[Callable[[int], np.ndarray], str | None]:
    """How to read rows of the shard at ``url`` when ``wanted`` of them are needed, and its
    local path: from a memory map (local), from the shard read whole (remote, many rows), or
    one ranged request per row (remote, a few rows of a big shard)."""
    local = local_path(rewrite_url(url))
    if local is None:
        header = read_header(url, settings.options)
        if wanted * header.row_bytes * 8 <= header.data_bytes:
            return lambda row: read_row(url, header, row, settings.options), None
    rows = Rows.open(url, settings.options, settings.expected_hash(url), size=settings.expected_size(url))
    return rows.row, rows.local_path


def read_positions(positions: Sequence[Position], settings: ReadSettings) -> list[dict[str, Any]]:
    """The samples at ``positions`` (row indices); each shard is opened once."""
    by_url: dict[str, list[int]] = {}
    for index, position in enumerate(positions):
        by_url.setdefault(position.url, []).append(index)
    samples: list[dict[str, Any]] = [{} for _ in positions]
    for url, indices in by_url.items():
        read, path = _row_source(url, len(indices), settings)
        stem = shard_stem(url)
        for index in indices:
            position = positions[index]
            try:
                data = read(position.offset)
            except IndexError as exn:
                raise ShardError(url, position.offset, f"no such row (restoring a buffer): {exn}") from None
            extra: dict[str, Any] = {}
            if settings.add_local_path and path is not None:
                extra["__local_path__"] = path
            if position.pad:
                extra["__pad__"] = True
            samples[index] = with_extra(row_sample(url, stem, position.offset, position.ordinal, data), extra)
    return samples
