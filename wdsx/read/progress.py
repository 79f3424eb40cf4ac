"""A shard reader's progress through its share of an epoch: the reader's checkpoint state.

The share is a :class:`~wdsx.read.deal.ConsumerPlan` (leftover single samples, then spans of
the epoch's shard order). Progress says how many leftovers were delivered, which span and
which shard of it is being read, and the cursor in that shard. The plan itself is stored only
when it was not dealt from the epoch (after a re-deal to another topology); otherwise it is
recomputed from the epoch, and the digest of the sample counts it was made with guards that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from wdsx.read import deal
from wdsx.read.samples import Cursor
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable

_DEALS = ("round-robin", "spans")


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
        """The progress :meth:`to_json` wrote; a stored plan must hold the progress."""
        data = validate.mapping(data)
        cursor = Cursor(validate.optional_integer(data, "offset"), validate.integer(data, "ordinal"))
        cursor.done = validate.boolean(data, "piece_done")
        plan = None
        if "plan" in data:
            with validate.within("plan"):
                plan = deal.ConsumerPlan.from_json(data["plan"], table)
        progress = cls(
            span=validate.integer(data, "span"),
            pos=validate.integer(data, "pos"),
            cursor=cursor,
            leftover=validate.integer(data, "leftover"),
            draws=validate.integer(data, "draws"),
            taken=validate.integer(data, "taken"),
            done=validate.boolean(data, "done"),
            counts=validate.optional_text(data, "counts", default=None),
            plan=plan,
            explicit=plan is not None,
            round_robin=validate.text(data, "deal", "spans", _DEALS) == "round-robin",
        )
        if plan is not None:
            progress.check_within(plan)
        return progress

    def check_within(self, plan: deal.ConsumerPlan, counts: Sequence[int] | None = None) -> None:
        """Refuse progress that lies outside ``plan`` (the share it reads): a span or a
        leftover past the plan's end, a shard outside the span being read, an ordinal outside
        that shard's part of the span (or past its sample count, ``counts`` being the sample
        counts in the epoch's order, when known)."""
        if self.leftover > len(plan.leftovers):
            raise validate.invalid(
                "leftover", f"at most the plan's {len(plan.leftovers)} leftovers", self.leftover
            )
        if self.span > len(plan.spans):
            raise validate.invalid("span", f"at most the plan's {len(plan.spans)} spans", self.span)
        if self.done or self.span == len(plan.spans):
            return
        span = plan.spans[self.span]
        last = max(span.start, span.end if span.end_ordinal else span.end - 1)
        if not span.start <= self.pos <= last:
            raise validate.invalid(
                "pos", f"a shard of span {self.span}, from {span.start} to {last}", self.pos
            )
        first = span.start_ordinal if self.pos == span.start else 0
        stop = span.end_ordinal if self.pos == span.end else None
        if counts is not None and self.pos < len(counts):
            stop = counts[self.pos] if stop is None else min(stop, counts[self.pos])
        if self.cursor.ordinal < first or (stop is not None and self.cursor.ordinal > stop):
            limits = f"from {first}" + ("" if stop is None else f" to {stop}")
            raise validate.invalid(
                "ordinal", f"an ordinal of shard {self.pos}'s part of the span, {limits}", self.cursor.ordinal
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
