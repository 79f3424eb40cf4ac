"""Where a sample came from: the one position type of every checkpoint, and its compact form.

A :class:`Position` names the shard URL, the byte offset of the sample's first record, the
sample's ordinal in the shard, and whether it is a padding repeat (read a second time so that
every reader yields the same number of batches). Readers stamp every sample with one; stages
that hold samples keep only their positions in a checkpoint; restoring reads them again.
"""

from __future__ import annotations

import base64
import itertools
import operator
import zlib
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from wdsx.core.errors import NotResumableError, StateError


class Position(NamedTuple):
    """Where one sample starts: ``(url, byte offset, ordinal in the shard, padding repeat)``."""

    url: str
    offset: int
    ordinal: int
    pad: bool = False

    def as_padding(self) -> Position:
        """The same sample, marked as read again to even out readers' shares."""
        return Position(self.url, self.offset, self.ordinal, True)


def make_position(url: str, offset: int, ordinal: int) -> Position:
    """A non-padding :class:`Position`, built without the NamedTuple constructor's overhead
    (readers call this once per sample)."""
    return _new_tuple(Position, (url, offset, ordinal, False))


_new_tuple: Any = tuple.__new__


_REMEMBERED = 256
"""Lists of at least this many positions are remembered between two encodings."""


class _Encoded:
    """A list of positions as last encoded: the list itself, a copy of what it held, and
    their rows."""

    __slots__ = ("source", "held", "rows")

    def __init__(self, source: list[Any], held: list[Any], rows: np.ndarray):
        self.source = source
        self.held = held
        self.rows = rows


class PackedPositions:
    """Positions as their table of (URL index, offset, ordinal, pad) rows, packed into
    :func:`pack_positions`' string only when :meth:`text` is asked for; pickled as the table.
    What a deferred :class:`PositionTable` writes; :func:`as_json` turns a state holding some
    into plain JSON."""

    __slots__ = ("rows", "_text")

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self._text: str | None = None

    def text(self) -> str:
        if self._text is None:
            self._text = _pack_table(self.rows)
        return self._text

    def __reduce__(self) -> tuple[Any, ...]:
        return PackedPositions, (self.rows,)


def as_json(state: Any) -> Any:
    """``state`` (JSON, perhaps with :class:`PackedPositions` inside) as plain JSON."""
    if isinstance(state, PackedPositions):
        return state.text()
    if isinstance(state, dict):
        return {key: as_json(value) for key, value in state.items()}
    if isinstance(state, list):
        return [as_json(value) for value in state]
    return state


class PositionTable:
    """Writes positions against one URL list per checkpoint, so each URL is stored once."""

    def __init__(self, urls: Iterable[str] = (), *, deferred: bool = False):
        self.urls: list[str] = list(urls)
        self._index = {url: i for i, url in enumerate(self.urls)}
        self._recent: dict[int, _Encoded] = {}
        self.deferred = deferred
        """Whether :meth:`encode` leaves the packing to whoever reads the state (see
        :class:`PackedPositions`): a WebLoader worker, which writes a state with every batch
        while the main process reads one only when asked for a checkpoint."""

    def encode(self, positions: Iterable[Any]) -> str | PackedPositions:
        """Positions as one short ASCII string (see :func:`pack_positions`), or, for a
        ``deferred`` table, as the :class:`PackedPositions` that becomes that string.

        A worker writes a checkpoint with every batch, and a shuffle buffer changes by about a
        batch between two: for a large list seen before (the same list object), only the
        entries that are not the same objects as last time are converted again."""
        remembered = type(positions) is list and len(positions) >= _REMEMBERED
        held = positions if type(positions) is list else list(positions)
        recent = self._recent.get(id(held)) if remembered else None
        if recent is not None and recent.source is held:
            rows, before = recent.rows, recent.held
            kept = min(len(held), len(before))
            changed = [
                *itertools.compress(range(kept), map(operator.is_not, held, before)),
                *range(kept, len(held)),
            ]
            if len(rows) != len(held):
                rows = np.resize(rows, (len(held), 4))
            rows[changed] = self._rows([held[i] for i in changed])
        else:
            rows = self._rows(held)
        if remembered:
            if id(held) not in self._recent and len(self._recent) >= 8:
                self._recent.pop(next(iter(self._recent)))
            self._recent[id(held)] = _Encoded(held, list(held), rows)
        return PackedPositions(rows.copy()) if self.deferred else _pack_table(rows)

    def _rows(self, positions: list[Any]) -> np.ndarray:
        """``positions`` as an n x 4 table of (URL index, offset, ordinal, pad)."""
        if any(type(position) is not Position for position in positions):
            raise NotResumableError(
                "a stage holds items without a single sample position (whole batches, or items "
                "from an opaque source); checkpoint before batching, or unbatch first"
            )
        rows = np.zeros((len(positions), 4), dtype=np.int64)
        if positions:
            urls, rows[:, 1], rows[:, 2], rows[:, 3] = zip(*positions)
            for url in dict.fromkeys(urls):  # new URLs join the table in order of appearance
                if url not in self._index:
                    self._index[url] = len(self.urls)
                    self.urls.append(url)
            rows[:, 0] = list(map(self._index.__getitem__, urls))
        return rows

    def decode(self, packed: str | PackedPositions) -> list[Position]:
        """The positions :meth:`encode` was given, in their order."""
        rows = packed.rows.tolist() if isinstance(packed, PackedPositions) else unpack_positions(packed)
        urls = self.urls
        if any(row[0] >= len(urls) for row in rows):
            raise StateError(
                f"checkpoint positions refer to a URL missing from its URL table (it has {len(urls)} URLs)"
            )
        return [Position(urls[index], offset, ordinal, bool(pad)) for index, offset, ordinal, pad in rows]


_WIDTHS = tuple((np.dtype(kind).newbyteorder("<"), np.iinfo(kind)) for kind in (np.int8, np.int16, np.int32))
_WIDEST = np.dtype(np.int64).newbyteorder("<")


def _narrowest(column: np.ndarray) -> np.dtype:
    """The narrowest little-endian integer type that holds every value of ``column``."""
    if not len(column):
        return _WIDTHS[0][0]
    low, high = int(column.min()), int(column.max())
    return next((kind for kind, limits in _WIDTHS if limits.min <= low and high <= limits.max), _WIDEST)


def pack_positions(rows: list[tuple[int, int, int, int]]) -> str:
    """Rows of ``(url index, offset, ordinal, pad)`` as a compact JSON-safe string.

    Buffered samples come from a few shards in random order, so the rows are sorted (which
    makes neighbouring offsets and ordinals differ by about one sample), stored as differences,
    column by column in the narrowest integer type, with each row's rank in the sorted order,
    and compressed: about 5 bytes per sample instead of about 20 as JSON lists.
    """
    return _pack_table(np.array(rows, dtype=np.int64).reshape(-1, 4))


def _pack_table(table: np.ndarray) -> str:
    """:func:`pack_positions` of the rows of an ``n x 4`` int64 array."""
    order = np.lexsort((table[:, 1], table[:, 2], table[:, 0]))
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    deltas = np.diff(table[order], axis=0, prepend=np.zeros((1, 4), dtype=np.int64))
    columns = [*deltas.T, ranks]
    types = [_narrowest(column) for column in columns]
    data = b"".join(column.astype(kind).tobytes() for column, kind in zip(columns, types))
    widths = "".join(str(kind.itemsize) for kind in types)
    return f"{len(table)}:{widths}:{base64.b64encode(zlib.compress(data, 1)).decode('ascii')}"


MAX_PACKED_POSITIONS = 1 << 22
"""The most positions one packed string may declare: far more than a buffer holds (a shuffle
buffer of 4 million samples), and a bound on what decoding one may allocate."""

_ROW_WIDTHS = frozenset("1248")


def unpack_positions(packed: str) -> list[tuple[int, int, int, int]]:
    """The rows :func:`pack_positions` was given, in their order.

    A checkpoint may be damaged or hostile: the string's own header (its row count and column
    widths) says exactly how many bytes its compressed part inflates to, and inflating stops
    there, so a small string cannot claim gigabytes (a "zlib bomb"). Rows that no packing
    writes (a rank that is not a permutation, a negative offset or ordinal, a padding flag
    other than 0 or 1) are refused too."""
    if not isinstance(packed, str):
        raise StateError(
            f"corrupt buffer positions in checkpoint: expected a packed string, found {packed!r:.60}"
        )
    try:
        count_text, widths, encoded = packed.split(":")
        count = int(count_text)
        if not 0 <= count <= MAX_PACKED_POSITIONS:
            raise ValueError(f"a count from 0 to {MAX_PACKED_POSITIONS} positions, found {count_text!r}")
        if len(widths) != 5 or not set(widths) <= _ROW_WIDTHS:
            raise ValueError(f"five column widths of 1, 2, 4 or 8 bytes, found {widths!r}")
        size = count * sum(map(int, widths))
        data = _inflate(base64.b64decode(encoded, validate=True), size)
        columns, start = [], 0
        for width in widths:
            kind = np.dtype(f"<i{width}")
            columns.append(np.frombuffer(data, kind, count, start).astype(np.int64))
            start += count * kind.itemsize
        ranks = columns[4]
        if count and not np.array_equal(np.sort(ranks), np.arange(count)):
            raise ValueError("row ranks that are a permutation of the rows")
        table = np.cumsum(np.stack(columns[:4], axis=1), axis=0)[ranks]
        if count and (table[:, :3].min() < 0 or not np.isin(table[:, 3], (0, 1)).all()):
            raise ValueError("rows of non-negative URL indices, offsets and ordinals, and 0/1 padding flags")
    except (ValueError, TypeError, IndexError, zlib.error) as error:
        raise StateError(f"corrupt buffer positions in checkpoint: {error}") from error
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in table.tolist()]


def _inflate(compressed: bytes, size: int) -> bytes:
    """``compressed`` inflated, which must give exactly ``size`` bytes: inflating stops one
    byte past that, whatever the data claims."""
    inflater = zlib.decompressobj()
    data = inflater.decompress(compressed, size + 1)
    if len(data) != size or not inflater.eof or inflater.unconsumed_tail or inflater.unused_data:
        raise ValueError(f"a compressed table of exactly {size} bytes, as its header declares")
    return data
