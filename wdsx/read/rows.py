"""Whole batches of rows, gathered in one step instead of sample by sample.

A reader of a row format (``.npy``) can hand the batching stage right after it a whole batch
at once (:class:`RowSource`): the rows' data gathered with one ``take``, and the per-row
metadata — keys and positions — as lazy columns that build each element only when it is
looked at. Building a batch then costs about what gathering its rows costs, whatever the
batch size; a checkpoint, an ``unbatched()`` or a look at ``batch["__key__"]`` materialises
only what it touches.

The columns are read-only sequences: they index, slice (into lists), iterate, have a length
and compare equal to lists with the same elements.
"""

from __future__ import annotations

import bisect
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

import numpy as np

from wdsx.core import allocate
from wdsx.state.position import Position

T = TypeVar("T")


class RowColumn(Sequence[T]):
    """A column of a batch of rows (``rows``: their row indices), built element by element on
    access. Subclasses say how one element is made (:meth:`item`)."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def item(self, index: int) -> T:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self.item(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError("row column index out of range")
        return self.item(index)

    def __iter__(self) -> Iterator[T]:
        return map(self.item, range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Sequence, np.ndarray)) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


class RowKeys(RowColumn[str]):
    """The ``__key__`` column: ``<shard stem>/<row>`` for each row."""

    def __init__(self, stem: str, rows: np.ndarray):
        self.rows = rows  # (RowColumn's __init__, written out: a batch makes two columns)
        self.stem = stem

    def item(self, index: int) -> str:
        return f"{self.stem}/{self.rows[index]}"

    def __iter__(self) -> Iterator[str]:
        prefix = self.stem + "/"
        return iter([prefix + str(row) for row in self.rows.tolist()])


class RowPositions(RowColumn[Position]):
    """The positions of a batch of consecutive samples of one shard: row ``rows[i]`` is the
    sample of ordinal ``first + i``."""

    def __init__(self, url: str, rows: np.ndarray, first: int, pad: bool = False):
        self.rows = rows
        self.url = url
        self.first = first
        self.pad = pad

    def item(self, index: int) -> Position:
        return Position(self.url, int(self.rows[index]), self.first + index, self.pad)

    def __iter__(self) -> Iterator[Position]:
        url, pad, make = self.url, self.pad, tuple.__new__
        rows = self.rows.tolist()
        return iter(
            [make(Position, (url, row, ordinal, pad)) for ordinal, row in enumerate(rows, self.first)]
        )


class JoinedColumn(RowColumn[T]):
    """Columns of consecutive parts of a batch, one after the other (still built element by
    element on access, where the parts are). ``JoinedColumn(elements)`` is a column of the
    elements, as code that rebuilds a sequence from its type expects (torch's collation)."""

    def __init__(self, *parts: Sequence[T]):
        self.ends = list(itertools.accumulate(len(part) for part in parts))
        """Where each part ends in the joined column."""
        self.parts = parts

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def item(self, index: int) -> T:
        part = bisect.bisect_right(self.ends, index)
        return self.parts[part][index - (self.ends[part - 1] if part else 0)]

    def __iter__(self) -> Iterator[T]:
        return (element for part in self.parts for element in part)


def join_columns(head: dict[str, Any], block: dict[str, Any]) -> dict[str, Any] | None:
    """One batch of the samples of collated batch ``head`` followed by those of ``block``
    (columns joined: arrays concatenated, other columns as lists); None when their fields, or
    their arrays' dtypes or row shapes, differ (collating them together would fail or convert)."""
    if list(head) != list(block):
        return None
    joined: dict[str, Any] = {}
    for field, first in head.items():
        second = block[field]
        if isinstance(first, np.ndarray) and isinstance(second, np.ndarray):
            if first.dtype != second.dtype or first.shape[1:] != second.shape[1:]:
                return None
            out = allocate.empty((len(first) + len(second), *first.shape[1:]), first.dtype)
            joined[field] = np.concatenate([first, second], out=out)
        elif isinstance(first, list) and isinstance(second, list):
            joined[field] = first + second
        elif isinstance(first, (list, RowColumn)) and isinstance(second, (list, RowColumn)):
            parts = first.parts if isinstance(first, JoinedColumn) else (first,)
            joined[field] = JoinedColumn(*parts, second)
        else:
            return None
    return joined


class RowSource(ABC):
    """A piece of a shard being read that can also hand out whole batches of its samples
    (an abstract class rather than a protocol: readers check for it once per shard, and a
    protocol's check costs tens of microseconds)."""

    joins: bool
    """Whether a batch may still start with samples held before it (False once one did not)."""

    @abstractmethod
    def left(self) -> int:
        """How many samples the piece has left."""

    @abstractmethod
    def take(
        self, size: int, head: dict[str, Any] | None = None, stamps: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], Sequence[Position]] | None:
        """The next ``size`` samples as one batch, collated as ``default_collation_fn`` would,
        with their positions, and the piece's cursor moved past them. ``stamps`` are fields
        the reading stage gives every sample (one value each). With ``head`` (a collated batch
        of samples held before these), the batch is ``head`` followed by them. None, and the
        cursor left alone, when the piece has fewer samples left or ``head`` does not join."""

    @abstractmethod
    def batches(
        self, size: int, stamps: dict[str, Any] | None = None
    ) -> Iterator[tuple[dict[str, Any], Sequence[Position]]]:
        """Whole batches of ``size`` samples from the cursor on, as :meth:`take` makes them,
        while the piece has that many left: the loop a batching stage runs between the
        boundaries of pieces, with no per-batch checks. The cursor is past each batch when
        it is yielded, so a checkpoint taken then resumes after it."""
