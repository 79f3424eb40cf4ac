"""A shard reader's progress through its share of an epoch: the reader's checkpoint state.

The share is a :class:`~wdsx.read.deal.ConsumerPlan` (leftover single samples, then spans of
the epoch's shard order). Progress says how many leftovers were delivered, which span and
which shard of it is being read, and the cursor in that shard. The plan itself is stored only
when it was not dealt from the epoch (after a re-deal to another topology); otherwise it is
recomputed from the epoch, and the digest of the sample counts it was made with guards that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wdsx.read import deal
from wdsx.read.samples import Cursor
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable


@dataclass
class ReaderProgress:
    """Where a shard-reading stage is in its epoch."""

    span: int = 0
    """Index of the span being read (``len(plan.spans)`` once all are read)."""
    pos: int = 0
    """Position in the epoch's shard order of the shard being read (resampled: shard id)."""
    cursor: Cursor = field(default_factory=lambda: Cursor(0, 0))
    leftover: int = 0
    """Leftover samples of the plan already delivered."""
    draws: int = 0
    """Shards drawn so far (resampled readers)."""
    taken: int = 0
    """URLs taken from upstream so far (``tarfile_to_samples``)."""
    done: bool = False
    counts: str | None = None
    """Digest of the per-shard sample counts the plan was dealt with."""
    plan: deal.ConsumerPlan | None = None
    explicit: bool = False
    """The plan came from a re-deal (and is stored), not from the epoch."""
    round_robin: bool = True
    """The epoch's plan deals whole shards round-robin; False in states written before wdsx
    dealt that way (their plans were contiguous spans, and are recomputed as such)."""

    def to_json(self, table: PositionTable) -> JsonDict:
        data: JsonDict = {
            "span": self.span,
            "pos": self.pos,
            "offset": self.cursor.offset,
            "ordinal": self.cursor.ordinal,
            "piece_done": self.cursor.done,
            "leftover": self.leftover,
            "draws": self.draws,
            "taken": self.taken,
            "done": self.done,
            "counts": self.counts,
            "deal": "round-robin" if self.round_robin else "spans",
        }
        if self.explicit and self.plan is not None:
            data["plan"] = self.plan.to_json(table)
        return data

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> ReaderProgress:
        cursor = Cursor(data["offset"], int(data["ordinal"]))
        cursor.done = bool(data["piece_done"])
        plan = deal.ConsumerPlan.from_json(data["plan"], table) if "plan" in data else None
        return cls(
            span=int(data["span"]),
            pos=int(data["pos"]),
            cursor=cursor,
            leftover=int(data["leftover"]),
            draws=int(data["draws"]),
            taken=int(data["taken"]),
            done=bool(data["done"]),
            counts=data.get("counts"),
            plan=plan,
            explicit=plan is not None,
            round_robin=data.get("deal") == "round-robin",
        )

    @classmethod
    def starting(cls, plan: deal.ConsumerPlan) -> ReaderProgress:
        """Progress at the start of an explicitly given plan (a re-dealt share)."""
        first = plan.spans[0] if plan.spans else deal.Span(0, 0, 0)
        return cls(
            pos=first.start, cursor=Cursor(first.offset, first.start_ordinal), plan=plan, explicit=True
        )

    def held(self) -> list[Position]:
        """A reader holds no samples between deliveries."""
        return []

    def unread(self, plan: deal.ConsumerPlan) -> tuple[list[deal.Span], list[Position]]:
        """The spans and leftover samples of ``plan`` this reader has not delivered yet."""
        if self.done:
            return [], []
        pos, ordinal, offset = self.pos, self.cursor.ordinal, self.cursor.offset
        if self.cursor.done:
            pos, ordinal, offset = pos + 1, 0, 0
        return deal.remaining(plan, self.span, pos, ordinal, offset), plan.leftovers[self.leftover :]


def upgrade_plan_v2(saved: JsonDict, urls: list[str], table: PositionTable) -> JsonDict:
    """A version-2 reader state in today's form: its plan's leftovers were
    ``[[shard index, offset, ordinal], pad]`` against the reader's shard list."""
    if "plan" not in saved:
        return saved
    plan = saved["plan"]
    leftovers = [
        Position(urls[shard], offset, ordinal, bool(pad))
        for (shard, offset, ordinal), pad in plan["leftovers"]
    ]
    return {**saved, "plan": {"spans": plan["spans"], "leftovers": table.encode(leftovers)}}
