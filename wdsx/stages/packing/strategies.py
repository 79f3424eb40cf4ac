"""Where packed documents go: the greedy and best-fit placements, free of any I/O.

A packer receives documents one at a time (:meth:`Packer.add`) and yields each row as soon as
it is complete, as the list of :data:`Piece` s it holds. Between two yields it can say exactly
what it holds (:meth:`Packer.held`): the open rows, each a list of document remainders, and at
most one *pending* document that is being split over rows or waits for a row to make room.
Every document it holds is kept as a remainder ``tokens[start:]``: ``start`` counts the tokens
already emitted, so :meth:`Packer.resume` rebuilds the same packer from the same documents.
Resuming a pending document is adding it again: that continues exactly where the first run was.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any

import numpy as np


class Document:
    """One document: its tokens, where it was read from, its key, and how many of its first
    tokens are already emitted (or were skipped: a remainder handed over by a re-deal)."""

    __slots__ = ("tokens", "position", "key", "start")

    def __init__(self, tokens: np.ndarray, position: Any, key: str | None, start: int = 0):
        self.tokens = tokens
        self.position = position
        self.key = key
        self.start = start

    def left(self) -> int:
        """Tokens not emitted yet."""
        return len(self.tokens) - self.start


Piece = tuple[Document, int, int]
"""``tokens[begin:end]`` of a document, as one segment of a row."""

PENDING = -1
"""The row number :meth:`Packer.held` gives a document that sits in no open row."""


class OpenRow:
    """A row being filled: its pieces, the tokens they hold, and when it was opened."""

    __slots__ = ("pieces", "used", "opened")

    def __init__(self, opened: int = 0):
        self.pieces: list[Piece] = []
        self.used = 0
        self.opened = opened

    def add_rest(self, document: Document) -> None:
        """Put all of ``document`` not emitted yet into this row."""
        self.pieces.append((document, document.start, len(document.tokens)))
        self.used += document.left()


class Packer:
    """Packs document remainders into rows of ``length`` tokens (see the module docstring)."""

    def __init__(self, length: int, split: bool):
        self.length = length
        self.split = split
        self.pending: Document | None = None

    def add(self, document: Document) -> Iterator[list[Piece]]:
        """Place ``document`` (from its ``start`` on), yielding the rows that completes."""
        raise NotImplementedError

    def finish(self) -> Iterator[list[Piece]]:
        """Yield every open row, oldest first, at the end of the input."""
        raise NotImplementedError

    def open_rows(self) -> list[OpenRow]:
        """The open rows, oldest first."""
        raise NotImplementedError

    def reopen(self, rows: list[list[Document]]) -> None:
        """Refill the (empty) packer's open rows, oldest first, with these remainders."""
        raise NotImplementedError

    def held(self) -> list[tuple[Document, int]]:
        """Every document held, with the open row it sits in (oldest first, from 0) or
        :data:`PENDING`; in row order, the pending one last."""
        held = [(piece[0], number) for number, row in enumerate(self.open_rows()) for piece in row.pieces]
        if self.pending is not None:
            held.append((self.pending, PENDING))
        return held

    def resume(self, rows: list[list[Document]], pending: Document | None) -> Iterator[list[Piece]]:
        """Come back to what :meth:`held` described, yielding the rows the pending document
        still completes."""
        self.reopen(rows)
        if pending is not None:
            yield from self.add(pending)

    def check_fits(self, document: Document) -> None:
        """Refuse a document longer than a row where documents are not split (the stage cuts
        or refuses those before they get here)."""
        if not self.split and document.left() > self.length:
            raise ValueError(f"a document of {document.left()} tokens does not fit rows of {self.length}")

    def _split_off(self, document: Document, size: int) -> Piece:
        """The next ``size`` tokens of ``document``, which then count as emitted."""
        piece = (document, document.start, document.start + size)
        document.start += size
        if not document.left():
            self.pending = None
        return piece


class GreedyPacker(Packer):
    """Documents in arrival order into one open row. With ``split`` a document that does not
    fit fills the row and continues in the next (every row but the last is full); without,
    it starts the next row."""

    def __init__(self, length: int, split: bool):
        super().__init__(length, split)
        self.row = OpenRow()

    def add(self, document: Document) -> Iterator[list[Piece]]:
        self.check_fits(document)
        self.pending = document
        while True:
            space = self.length - self.row.used
            if document.left() <= space:
                self.pending = None
                self.row.add_rest(document)
                if self.row.used == self.length:
                    yield self._take()
                return
            if self.split:
                self.row.pieces.append(self._split_off(document, space))
                self.row.used = self.length
            yield self._take()

    def _take(self) -> list[Piece]:
        pieces, self.row = self.row.pieces, OpenRow()
        return pieces

    def finish(self) -> Iterator[list[Piece]]:
        if self.row.pieces:
            yield self._take()

    def open_rows(self) -> list[OpenRow]:
        return [self.row] if self.row.pieces else []

    def reopen(self, rows: list[list[Document]]) -> None:
        if len(rows) > 1:
            raise ValueError(f"a greedy packer holds one open row, not {len(rows)}")
        for document in rows[0] if rows else []:
            self.row.add_rest(document)


class BestFitPacker(Packer):
    """Each document into the open row where it fits most tightly (the least room left; the
    oldest of equals), else into a new row. At most ``window`` rows are open: opening one
    more first emits the fullest. A full row is emitted at once. With ``split`` a document
    longer than a row first gives whole rows of its leading tokens; its rest is placed."""

    def __init__(self, length: int, split: bool, window: int):
        super().__init__(length, split)
        self.window = window
        self.rows: list[OpenRow] = []  # sorted by (room left, opened): the best fit is a bisection away
        self.order: list[tuple[int, int]] = []
        self.opened = 0

    def add(self, document: Document) -> Iterator[list[Piece]]:
        self.check_fits(document)
        self.pending = document
        length = self.length
        while self.split and document.left() >= length:
            yield [self._split_off(document, length)]
        size = document.left()
        if size == 0:
            self.pending = None
            return
        found = bisect.bisect_left(self.order, (size, -1))
        if found < len(self.rows):
            row = self._remove(found)
        else:
            if len(self.rows) >= self.window:
                yield self._remove(0).pieces
            row = OpenRow(self.opened)
            self.opened += 1
        self.pending = None
        row.add_rest(document)
        if row.used == length:
            yield row.pieces
        else:
            self._insert(row)

    def _remove(self, index: int) -> OpenRow:
        del self.order[index]
        return self.rows.pop(index)

    def _insert(self, row: OpenRow) -> None:
        key = (self.length - row.used, row.opened)
        index = bisect.bisect_left(self.order, key)
        self.order.insert(index, key)
        self.rows.insert(index, row)

    def finish(self) -> Iterator[list[Piece]]:
        while self.rows:
            oldest = min(range(len(self.rows)), key=lambda index: self.rows[index].opened)
            yield self._remove(oldest).pieces

    def open_rows(self) -> list[OpenRow]:
        return sorted(self.rows, key=lambda row: row.opened)

    def reopen(self, rows: list[list[Document]]) -> None:
        for documents in rows:
            row = OpenRow(self.opened)
            self.opened += 1
            for document in documents:
                row.add_rest(document)
            self._insert(row)
