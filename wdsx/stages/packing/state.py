"""What a checkpoint keeps of a packing stage: the documents it holds and how far into each.

``positions`` are the held documents in the order :meth:`~wdsx.stages.packing.strategies.Packer.held`
gives them, ``starts`` the tokens of each already emitted, ``rows`` the open row each sits in
(``-1``: the pending document, last). Restoring reads those documents again and rebuilds the
open rows. ``skip_positions``/``skip_starts`` name documents this reader has not read yet whose
first tokens another reader already emitted: remainders handed over by an elastic re-deal.
"""

from __future__ import annotations

from typing import Any

from wdsx.stages.packing.strategies import PENDING, Document, Packer
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable


class PackState:
    """The checkpointable state of a packing stage. While the stage runs it reads what it
    holds from its live packer (:meth:`follow`); a restored one holds the saved lists."""

    def __init__(
        self,
        positions: list[Position] | None = None,
        starts: list[int] | None = None,
        rows: list[int] | None = None,
        skips: dict[Position, int] | None = None,
    ):
        self.positions = positions or []
        self.starts = starts or []
        self.rows = rows or []
        self.skips = skips if skips is not None else {}
        self.packer: Packer | None = None

    def follow(self, packer: Packer) -> None:
        """Describe ``packer``'s holdings from now on."""
        self.packer = packer

    def holdings(self) -> tuple[list[Any], list[int], list[int]]:
        """(positions, starts, rows) of the documents held now."""
        if self.packer is None:
            return self.positions, self.starts, self.rows
        held = self.packer.held()
        return (
            [document.position for document, _ in held],
            [document.start for document, _ in held],
            [row for _, row in held],
        )

    def to_json(self, table: PositionTable) -> JsonDict:
        positions, starts, rows = self.holdings()
        data: JsonDict = {"positions": table.encode(positions), "starts": starts, "rows": rows}
        if self.skips:
            data["skip_positions"] = table.encode(list(self.skips))
            data["skip_starts"] = list(self.skips.values())
        return data

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> PackState:
        data = validate.mapping(data)
        positions = validate.positions(data, "positions", table)
        starts = validate.integers(data, "starts", length=len(positions))
        rows = validate.integers(data, "rows", length=len(positions), low=PENDING)
        _check_rows(rows)
        skips: dict[Position, int] = {}
        if "skip_positions" in data:
            skipped = validate.positions(data, "skip_positions", table)
            skip_starts = validate.integers(data, "skip_starts", length=len(skipped), low=1)
            skips = dict(zip(skipped, skip_starts))
        return cls(positions, starts, rows, skips)

    def held(self) -> list[Position]:
        return list(self.holdings()[0])

    def partly_emitted(self) -> dict[Position, int]:
        """Documents some of whose tokens are emitted and the rest not (held or still to be
        read), with the count emitted: what a re-deal must hand to whoever reads them next."""
        positions, starts, _ = self.holdings()
        partial = {position: start for position, start in zip(positions, starts) if start > 0}
        return {**self.skips, **partial}

    def rebuilt(self, documents: list[Document]) -> tuple[list[list[Document]], Document | None]:
        """The open rows (oldest first) and pending document of this restored state, from the
        documents read again at its positions (the saved starts applied)."""
        open_rows: list[list[Document]] = []
        pending = None
        for document, start, row in zip(documents, self.starts, self.rows):
            if start > len(document.tokens):
                raise validate.invalid(
                    "starts", f"at most the {len(document.tokens)} tokens of document {document.key!r}", start
                )
            document.start = start
            if row == PENDING:
                pending = document
            else:
                while len(open_rows) <= row:
                    open_rows.append([])
                open_rows[row].append(document)
        return open_rows, pending


def _check_rows(rows: list[int]) -> None:
    """Open rows are numbered 0, 1, ... in order, then at most one pending document (-1)."""
    body = rows[:-1] if rows and rows[-1] == PENDING else rows
    ordered = all(row >= 0 for row in body) and (not body or body[0] == 0)
    if not ordered or any(after - before not in (0, 1) for before, after in zip(body, body[1:])):
        expected = "open rows numbered 0, 1, ... in order, then -1 for a pending document"
        raise validate.invalid("rows", expected, rows)
