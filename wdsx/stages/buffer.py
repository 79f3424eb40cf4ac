"""The state of a stage that holds items: the items, where they came from, and draw counts.

Checkpoints store only the positions; restoring re-reads those samples and replays the stages
between the reader and the buffer, so the buffer comes back with the same items in the same
order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wdsx.stages.base import Run


class Buffer:
    """Items held by a stage, the positions they were read from, and a draw counter."""

    __slots__ = ("items", "positions", "draws")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.positions: list[Any] = []
        self.draws = 0

    def snapshot(self, table: Any) -> dict:
        return {"positions": table.encode(self.positions), "draws": self.draws}

    @classmethod
    def attach(cls, run: Run, index: int, rebuild: Callable[[Any], Any] | None = None) -> Buffer:
        """A buffer registered with ``run``, refilled from the run's checkpoint if it has one.
        ``rebuild`` turns a replayed item into what the stage held (e.g. one row of a batch)."""
        buffer = cls()
        saved = run.register(index, buffer)
        if saved is not None:
            buffer.positions = run.table.decode(saved["positions"])
            buffer.items = run.reread(buffer.positions, index)
            if rebuild is not None:
                buffer.items = [rebuild(item) for item in buffer.items]
            buffer.draws = saved["draws"]
        return buffer
