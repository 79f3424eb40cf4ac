"""The checkpoint format: small, JSON-serialisable, versioned, and checked on restore.

A pipeline state holds the epoch, the seed, the reader's cursor (shard, byte offset, ordinal of
the next sample) and, for every stage that buffers samples, the positions of what it holds.
A buffer's positions are written against one URL table per state as a short ASCII string
(:func:`pack_positions`), so a shuffle buffer of 1000 samples costs a few kilobytes.
A fingerprint of the shard list and the stages makes a mismatched restore fail loudly.
"""

from __future__ import annotations

import base64
import itertools
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from wdsx.core.errors import NotResumableError, StateError

FORMAT = "wdsx-state"
LOADER_FORMAT = "wdsx-loader-state"
VERSION = 2


class PositionTable:
    """Encodes sample positions against a shared URL list."""

    def __init__(self, urls: Iterable[str] = ()):
        self.urls: list[str] = list(urls)
        self._index = {url: i for i, url in enumerate(self.urls)}

    def encode(self, positions: Iterable[tuple]) -> str:
        rows = []
        for position in positions:
            if not isinstance(position, tuple):
                raise NotResumableError(
                    "a stage holds items without a single sample position (whole batches, or items "
                    "from an opaque source); checkpoint before batching, or unbatch first"
                )
            url = position[0]
            index = self._index.get(url)
            if index is None:
                index = self._index[url] = len(self.urls)
                self.urls.append(url)
            rows.append((index, position[1], position[2], 1 if len(position) > 3 and position[3] else 0))
        return pack_positions(rows)

    def decode(self, packed: str) -> list[tuple]:
        positions = []
        for index, offset, ordinal, pad in unpack_positions(packed):
            url = self.urls[index]
            positions.append((url, offset, ordinal, True) if pad else (url, offset, ordinal))
        return positions


_WIDTHS = (np.int8, np.int16, np.int32, np.int64)


def _narrowest(column: np.ndarray) -> type:
    low, high = (int(column.min()), int(column.max())) if len(column) else (0, 0)
    return next(t for t in _WIDTHS if np.iinfo(t).min <= low and high <= np.iinfo(t).max)


def pack_positions(rows: list[tuple[int, int, int, int]]) -> str:
    """Rows of ``(url index, offset, ordinal, pad)`` as a compact JSON-safe string.

    Buffered samples come from a few shards in random order, so the rows are sorted (which
    makes neighbouring offsets and ordinals differ by about one sample), stored as differences,
    column by column in the narrowest integer type, with each row's rank in the sorted order,
    and compressed: about 5 bytes per sample instead of about 20 as JSON lists.
    """
    table = np.fromiter(itertools.chain.from_iterable(rows), np.int64, 4 * len(rows)).reshape(-1, 4)
    order = np.lexsort((table[:, 1], table[:, 2], table[:, 0]))
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    deltas = np.diff(table[order], axis=0, prepend=np.zeros((1, 4), dtype=np.int64))
    columns = [*deltas.T, ranks]
    types = [np.dtype(_narrowest(column)).newbyteorder("<") for column in columns]
    data = b"".join(column.astype(kind).tobytes() for column, kind in zip(columns, types))
    widths = "".join(str(kind.itemsize) for kind in types)
    return f"{len(table)}:{widths}:{base64.b64encode(zlib.compress(data, 1)).decode('ascii')}"


def unpack_positions(packed: str) -> list[tuple[int, int, int, int]]:
    """The rows :func:`pack_positions` was given, in their order."""
    try:
        count_text, widths, encoded = packed.split(":")
        count = int(count_text)
        data = zlib.decompress(base64.b64decode(encoded))
        columns, start = [], 0
        for width in widths:
            kind = np.dtype(f"<i{width}")
            columns.append(np.frombuffer(data, kind, count, start).astype(np.int64))
            start += count * kind.itemsize
        table = np.cumsum(np.stack(columns[:4], axis=1), axis=0)[columns[4]]
    except (ValueError, TypeError, IndexError, zlib.error) as error:
        raise StateError(f"corrupt buffer positions in checkpoint: {error}") from error
    return [tuple(row) for row in table.tolist()]


def check_format(state: Any, expected: str = FORMAT) -> None:
    """Raise :class:`StateError` unless ``state`` is a wdsx state of a version we read."""
    if not isinstance(state, dict) or state.get("format") != expected:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise StateError(f"not a {expected} checkpoint (found {found!r})")
    if state.get("version") != VERSION:
        raise StateError(
            f"{expected} version {state.get('version')} cannot be read by this wdsx (reads {VERSION})"
        )


def fingerprint_differences(saved: dict, current: dict) -> list[str]:
    """Human-readable differences between two pipeline fingerprints."""
    problems = []
    old, new = saved.get("stages", []), current.get("stages", [])
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            problems.append(f"stage {i} differs: checkpoint has {a}, pipeline has {b}")
    if len(old) != len(new):
        problems.append(f"checkpoint has {len(old)} stages, pipeline has {len(new)}")
    return problems
