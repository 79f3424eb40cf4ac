"""The state of a stage that holds items: the items, where they came from, and a draw count.

Checkpoints store only the positions; restoring re-reads those samples and replays the stages
between the reader and the buffer, so the buffer comes back with the same items in the same
order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wdsx.stages.base import Run
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable


class Buffer:
    """Items held by a stage, the positions they were read from, and a draw counter."""

    __slots__ = ("items", "positions", "draws")

    def __init__(self, positions: list[Any] | None = None, draws: int = 0) -> None:
        self.items: list[Any] = []
        self.positions: list[Any] = positions if positions is not None else []
        self.draws = draws

    def to_json(self, table: PositionTable) -> JsonDict:
        return {"positions": table.encode(self.positions), "draws": self.draws}

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> Buffer:
        data = validate.mapping(data)
        return cls(validate.positions(data, "positions", table), validate.integer(data, "draws"))

    def held(self) -> list[Position]:
        return list(self.positions)


def attach_buffer(
    run: Run, index: int, rebuild: Callable[[Any], Any] | None = None, kind: type[Buffer] | None = None
) -> Buffer:
    """Stage ``index``'s buffer in ``run`` (a ``kind``, which may add to what a buffer holds),
    refilled from the checkpoint if it has one. ``rebuild`` turns a replayed item into what
    the stage held (e.g. one row of a batch)."""
    buffer, restored = run.attach(index, kind or Buffer)
    if restored:
        items = run.reread(buffer.positions, index)
        buffer.items = [rebuild(item) for item in items] if rebuild is not None else items
    return buffer
