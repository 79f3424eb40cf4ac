"""The checkpoint format: small, JSON-serialisable, versioned, and checked on restore.

A pipeline state holds the epoch, the seed, the reader's cursor (shard, byte offset, ordinal of
the next sample) and, for every stage that buffers samples, the positions of what it holds.
Positions are written as ``[url_index, offset, ordinal]`` against one URL table per state, so a
shuffle buffer of 1000 samples costs a few tens of kilobytes, not a copy of the data.
A fingerprint of the shard list and the stages makes a mismatched restore fail loudly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .errors import NotResumableError, StateError

FORMAT = "wdsx-state"
LOADER_FORMAT = "wdsx-loader-state"
VERSION = 1


class PositionTable:
    """Encodes sample positions against a shared URL list."""

    def __init__(self, urls: Iterable[str] = ()):
        self.urls: list[str] = list(urls)
        self._index = {url: i for i, url in enumerate(self.urls)}

    def encode(self, positions: Iterable[tuple]) -> list[list[int]]:
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
            row = [index, position[1], position[2]]
            if len(position) > 3 and position[3]:
                row.append(1)
            rows.append(row)
        return rows

    def decode(self, rows: Iterable[Sequence[int]]) -> list[tuple]:
        positions = []
        for row in rows:
            url = self.urls[row[0]]
            positions.append(
                (url, row[1], row[2], True) if len(row) > 3 and row[3] else (url, row[1], row[2])
            )
        return positions


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
