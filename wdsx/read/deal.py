"""How one epoch's samples are dealt to consumers, and dealt again after a topology change.

A *consumer* is one reading stream: one DataLoader worker of one rank (``rank * workers +
worker``), or the main process when there are no workers. An epoch is the shard list in one
order (a pure function of seed and epoch). Each consumer reads *spans* of that order: a span
covers the samples from ``(start, start_ordinal)`` up to, not including, ``(end,
end_ordinal)``, comparing (shard position, sample ordinal) pairs. Spans of different
consumers never overlap and together cover the epoch, so every sample is read exactly once.

When per-shard sample counts are known, spans are cut at sample granularity, so consumers get
equal shares even with fewer shards than consumers, and the share sizes can be chosen so that
every consumer yields the same number of batches (the remainder policy). Without counts the
unit is a whole shard.

Resuming on a different number of consumers ("elastic" resume) pools what every old consumer
had not yet read, plus the samples that sat in their buffers, and deals that out again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from wdsx.core import rng
from wdsx.core.errors import StateError
from wdsx.state import validate
from wdsx.state.position import Position, PositionTable

REMAINDERS = ("exact", "pad", "drop")


@dataclass(frozen=True)
class Span:
    """A run of the epoch order: samples ``[(start, start_ordinal), (end, end_ordinal))``.

    ``offset`` is the byte offset of the first sample when known (resuming seeks to it);
    ``pad`` marks samples that are read a second time to even out the consumers' shares.
    """

    start: int
    start_ordinal: int
    end: int
    end_ordinal: int = 0
    offset: int | None = None
    pad: bool = False

    def to_json(self) -> list:
        return [self.start, self.start_ordinal, self.end, self.end_ordinal, self.offset, self.pad]

    @classmethod
    def from_json(cls, data: Sequence) -> Span:
        """The span :meth:`to_json` wrote: ``[start, start_ordinal, end, end_ordinal, offset,
        pad]``, which must run forward (start before end)."""
        if not isinstance(data, list) or len(data) != 6:
            raise validate.InvalidState(
                [], "a span [start, start_ordinal, end, end_ordinal, offset, pad]", data
            )
        start, start_ordinal, end, end_ordinal, offset, pad = data
        for index, value in enumerate(data[:4]):
            validate.check_integer(value, index)
        if offset is not None:
            validate.check_integer(offset, 4)
        if type(pad) is not bool:
            raise validate.invalid(5, "true or false", pad)
        if (end, end_ordinal) < (start, start_ordinal):
            raise validate.InvalidState([], "a span whose end does not come before its start", data)
        return cls(start, start_ordinal, end, end_ordinal, offset, pad)


@dataclass(frozen=True)
class Piece:
    """The part of a span inside one shard: ordinals ``[first, stop)`` of the shard at ``pos``."""

    pos: int
    first: int
    stop: int | None  # None: to the end of the shard
    offset: int | None
    pad: bool


@dataclass
class ConsumerPlan:
    """What one consumer reads in one epoch: single samples first (``leftovers``: samples an
    earlier topology had read into buffers but not delivered), then spans."""

    spans: list[Span]
    leftovers: list[Position] = field(default_factory=list)

    def to_json(self, table: PositionTable) -> dict:
        return {"spans": [span.to_json() for span in self.spans], "leftovers": table.encode(self.leftovers)}

    @classmethod
    def from_json(cls, data: dict, table: PositionTable) -> ConsumerPlan:
        data = validate.mapping(data)
        spans = []
        for index, span in enumerate(validate.listing(data, "spans")):
            with validate.within("spans", index):
                spans.append(Span.from_json(span))
        return cls(spans, validate.positions(data, "leftovers", table))


def epoch_order(nshards: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The shard ids of one epoch in reading order: a fresh permutation per (seed, epoch)."""
    if not shuffle:
        return list(range(nshards))
    return rng.permutation(nshards, rng.derive_seed("shard-order", seed, epoch))


def even_lengths(total: int, parts: int) -> list[int]:
    """Split ``total`` into ``parts`` sizes that differ by at most one, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def consumer_lengths(
    total: int, consumers: int, batch: int = 1, partial: bool = True, remainder: str = "exact"
) -> list[int]:
    """How many samples each consumer gets so that all yield the same number of batches.

    ``exact`` reads every sample once and accepts unequal batch counts. ``pad`` and ``drop``
    first try an even split (equal batch counts come for free unless the last round of
    batches cannot give every consumer at least one sample); otherwise ``pad`` repeats the
    fewest samples and ``drop`` skips the fewest needed. With ``partial=False`` batches are
    full, so shares are capped to what makes full batches and the rest is dropped.
    """
    if consumers < 1:
        raise ValueError(f"need at least one consumer, got {consumers}")
    if remainder not in REMAINDERS:
        raise ValueError(f"remainder must be one of {REMAINDERS}, got {remainder!r}")
    lengths = even_lengths(total, consumers)
    if remainder == "exact" or total == 0:
        return lengths
    batch = max(1, batch)
    if not partial:
        rounds = total // (consumers * batch)
        cap = (rounds + 1) * batch - 1
        return [min(length, cap) for length in lengths]
    rounds = -(-total // (consumers * batch))
    if total >= consumers * ((rounds - 1) * batch + 1):
        return lengths
    share = (rounds - 1) * batch + (1 if remainder == "pad" else 0)
    return [share] * consumers


Unit = tuple[Piece | Position, int]
"""A piece of a shard and its sample count, or one leftover sample and 1."""


def plan_epoch(
    consumers: int,
    counts_in_order: Sequence[int] | None,
    nshards: int,
    batch: int = 1,
    partial: bool = True,
    remainder: str = "exact",
) -> list[ConsumerPlan]:
    """Every consumer's plan for one epoch, as contiguous runs of the order. Without counts,
    whole shards are dealt."""
    units = _whole_shards(range(nshards), counts_in_order)
    return _deal(units, consumers, counts_in_order is not None, batch, partial, remainder)


def _whole_shards(positions: Iterable[int], counts_in_order: Sequence[int] | None) -> list[Unit]:
    """The shards at ``positions`` of the order as units (of one when counts are unknown)."""
    return [
        (Piece(pos, 0, None, 0, False), 1 if counts_in_order is None else counts_in_order[pos])
        for pos in positions
    ]


def webdataset_slot(reader: int, ranks: int, workers: int) -> int:
    """Which residue of the shard order webdataset gives a reader: its ``split_by_node``
    keeps every ``ranks``-th shard from ``rank``, then ``split_by_worker`` every
    ``workers``-th of those from ``worker``, so the reader gets the shards at
    ``rank + ranks * worker`` modulo ``ranks * workers``."""
    rank, worker = divmod(reader, workers)
    return rank + ranks * worker


def plan_round_robin(
    ranks: int,
    workers: int,
    counts_in_order: Sequence[int] | None,
    nshards: int,
    batch: int = 1,
    partial: bool = True,
    remainder: str = "exact",
    reorder: Callable[[list[int]], list[int]] | None = None,
) -> list[ConsumerPlan]:
    """Every consumer's plan for one epoch, dealt as webdataset deals shards: consumer ``r``
    (rank ``r // workers``, worker ``r % workers``) reads the whole shards of its
    :func:`webdataset_slot`, in order, or in the order ``reorder`` gives them (webdataset
    shuffles a reader's shards after splitting them).

    Whole shards go to their round-robin owner unless shares must be evened out: with counts,
    under the ``pad``/``drop`` policies (equal batch counts on every rank) or with fewer
    shards than consumers. Then the same sequence (each consumer's round-robin shards, one
    consumer after the other) is cut into balanced shares at sample granularity, so each
    consumer still reads mostly its own shards and only the cut shards move."""
    consumers = ranks * workers
    units: list[Unit] = []
    owned = []
    for reader in range(consumers):
        slot = webdataset_slot(reader, ranks, workers)
        positions = list(range(slot, nshards, consumers))
        mine = _whole_shards(reorder(positions) if reorder else positions, counts_in_order)
        units.extend(mine)
        owned.append(sum(size for _, size in mine))
    counted = counts_in_order is not None
    balanced = counted and (remainder != "exact" or nshards < consumers)
    return _deal(units, consumers, counted, batch, partial, remainder, None if balanced else owned)


def pieces(span: Span) -> Iterator[Piece]:
    """The per-shard parts of a span, in reading order."""
    last = span.end if span.end_ordinal else span.end - 1
    for pos in range(span.start, last + 1):
        first = span.start_ordinal if pos == span.start else 0
        stop = span.end_ordinal if pos == span.end else None
        if stop is not None and first >= stop:
            continue
        offset = span.offset if pos == span.start else 0
        yield Piece(pos, first, stop, 0 if first == 0 else offset, span.pad)


def remaining(plan: ConsumerPlan, span_index: int, pos: int, ordinal: int, offset: int | None) -> list[Span]:
    """The spans a consumer has not read yet, given its next sample's position."""
    if span_index >= len(plan.spans):
        return []
    current = plan.spans[span_index]
    rest = []
    if (pos, ordinal) < (current.end, current.end_ordinal):
        rest.append(Span(pos, ordinal, current.end, current.end_ordinal, offset, current.pad))
    return rest + plan.spans[span_index + 1 :]


def reshape(
    unread: Sequence[Span],
    leftovers: Sequence[Position],
    consumers: int,
    counts_in_order: Sequence[int] | None,
    batch: int = 1,
    partial: bool = True,
    remainder: str = "exact",
) -> list[ConsumerPlan]:
    """Deal the unread rest of an epoch to a new number of consumers.

    ``unread`` are the old consumers' remaining spans; ``leftovers`` are samples that had been
    read into buffers but never delivered. Both are dealt as one sequence (leftovers first),
    cut at sample granularity when counts are known and at piece granularity otherwise.
    """
    units: list[Unit] = [(item, 1) for item in leftovers]
    for span in sorted(unread, key=lambda s: (s.start, s.start_ordinal)):
        for piece in pieces(span):
            if counts_in_order is None:
                size = 1
            else:
                stop = counts_in_order[piece.pos] if piece.stop is None else piece.stop
                size = max(0, stop - piece.first)
            units.append((piece, size))
    return _deal(units, consumers, counts_in_order is not None, batch, partial, remainder)


def _deal(
    units: list[Unit],
    consumers: int,
    counted: bool,
    batch: int,
    partial: bool,
    remainder: str,
    lengths: list[int] | None = None,
) -> list[ConsumerPlan]:
    """Give consumer ``c`` the next ``lengths[c]`` samples of the unit sequence, wrapping
    around to its start (the repeats are marked as padding) when the lengths add up to more.
    Without ``lengths``, the shares are balanced under the remainder policy."""
    total = sum(size for _, size in units)
    if lengths is None and counted:
        lengths = consumer_lengths(total, consumers, batch, partial, remainder)
    elif lengths is None:
        lengths = even_lengths(total, consumers)
    plans = [ConsumerPlan([]) for _ in range(consumers)]
    index, used, lap = 0, 0, 0
    for plan, need in zip(plans, lengths):
        while total and (need > 0 or (index < len(units) and units[index][1] == 0)):
            if index == len(units):
                index, used, lap = 0, 0, lap + 1
            item, size = units[index]
            if isinstance(item, Position):
                plan.leftovers.append(item.as_padding() if lap > 0 else item)
                index, need = index + 1, need - 1
                continue
            take = min(need, size - used) if counted else size
            first = item.first + used
            if used + take >= size and item.stop is None:
                end = (item.pos + 1, 0)
            elif counted or item.stop is None:
                end = (item.pos, first + take)
            else:
                end = (item.pos, item.stop)
            offset = item.offset if used == 0 else None
            plan.spans.append(Span(item.pos, first, end[0], end[1], offset, item.pad or lap > 0))
            used += take
            need -= take
            if used >= size:
                index, used = index + 1, 0
    if total:
        for item, size in units[index:]:
            if size == 0 and isinstance(item, Piece):  # shards the counts call empty: read them anyway
                plans[-1].spans.append(Span(item.pos, item.first, item.pos + 1, 0, item.offset, item.pad))
    for plan in plans:
        plan.spans = _merge(plan.spans)
    return plans


def _merge(spans: list[Span]) -> list[Span]:
    """Join spans where one ends exactly where the next begins."""
    merged: list[Span] = []
    for span in spans:
        if merged:
            prev = merged[-1]
            if prev.pad == span.pad and (prev.end, prev.end_ordinal) == (span.start, span.start_ordinal):
                merged[-1] = Span(
                    prev.start, prev.start_ordinal, span.end, span.end_ordinal, prev.offset, prev.pad
                )
                continue
        merged.append(span)
    return merged


@dataclass(frozen=True)
class EpochDeal:
    """How a fixed shard list's epochs are dealt to readers: a plain value, used by the stage
    that reads the shards and by the re-deal of a checkpoint to another topology.

    ``batch``/``partial`` are those of the first batching stage after the reader, so that
    shares can give every reader the same number of batches; ``counts`` are per-shard sample
    counts (None: unknown, whole shards are dealt).
    """

    urls: tuple[str, ...]
    shuffle: bool = False
    counts: tuple[int, ...] | None = None
    remainder: str | None = None
    split_ranks: bool = True
    split_workers: bool = True
    batch: int = 1
    partial: bool = True
    round_robin: bool = True
    """Deal whole shards round-robin as webdataset does (:func:`plan_round_robin`); False:
    contiguous spans of the order (:func:`plan_epoch`), how checkpoints written before
    wdsx dealt round-robin were dealt."""
    reader_shuffle: Callable[[list[int], int, int], list[int]] | None = None
    """webdataset's seeded shard shuffle: instead of one shuffled order for all, the list in
    its own order, each reader's round-robin shards reordered by ``reader_shuffle(positions,
    seed, epoch)``."""

    def with_counts(self, counts: Sequence[int] | None) -> EpochDeal:
        return replace(self, counts=None if counts is None else tuple(counts))

    def with_batching(self, batch: int, partial: bool) -> EpochDeal:
        return replace(self, batch=batch, partial=partial)

    def order(self, seed: int, epoch: int) -> list[int]:
        """The shard ids of the epoch in reading order (the list's own order when each reader
        shuffles its own shards)."""
        return epoch_order(len(self.urls), seed, epoch, self.shuffle and self.reader_shuffle is None)

    def reader_of(self, rank: int, world_size: int, worker: int, num_workers: int) -> tuple[int, int]:
        """(this reader's index, number of readers) under the configured splitting."""
        ranks = world_size if self.split_ranks else 1
        workers = num_workers if self.split_workers else 1
        me = (rank if self.split_ranks else 0) * workers + (worker if self.split_workers else 0)
        return me, ranks * workers

    def remainder_for(self, world_size: int) -> str:
        """The remainder policy in force: the one given, else "pad" across ranks, else "exact"."""
        if self.remainder is not None:
            return self.remainder
        return "pad" if world_size > 1 and self.split_ranks else "exact"

    def counts_digest(self) -> str | None:
        """A short fingerprint of the per-shard sample counts (plans depend on them)."""
        return None if self.counts is None else f"{rng.derive_seed(*self.counts):016x}"

    def check_counts(self, saved: str | None) -> None:
        """Refuse to rebuild a checkpoint's plan from other sample counts than it was made with."""
        if saved != self.counts_digest():
            raise StateError(
                "the checkpoint's epoch was dealt with other per-shard sample counts than this "
                "dataset has now (a changed manifest, or counts given differently)"
            )

    def _counts_in(self, order: Sequence[int]) -> list[int] | None:
        return [self.counts[i] for i in order] if self.counts is not None else None

    def plan(self, seed: int, epoch: int, reader: int, readers: int, world_size: int) -> ConsumerPlan:
        """What reader ``reader`` of ``readers`` reads in ``epoch``."""
        order = self.order(seed, epoch)
        remainder = self.remainder_for(world_size)
        counts = self._counts_in(order)
        ranks = world_size if self.split_ranks else 1
        if self.round_robin:
            reorder = self.reader_shuffle
            plans = plan_round_robin(
                ranks,
                readers // ranks,
                counts,
                len(order),
                self.batch,
                self.partial,
                remainder,
                None if reorder is None else lambda positions: reorder(positions, seed, epoch),
            )
        else:
            plans = plan_epoch(readers, counts, len(order), self.batch, self.partial, remainder)
        return plans[reader]

    def share_size(self, seed: int, epoch: int, reader: int, readers: int, world_size: int) -> int:
        """How many samples reader ``reader`` of ``readers`` reads in ``epoch`` (padding
        included); needs the per-shard counts."""
        if self.counts is None:
            raise TypeError(
                "the number of samples per shard is unknown: write a manifest beside the shards "
                "(`wdsx index URLS`), pass counts=[...] or counts='scan', or set .with_epoch(n)"
            )
        return self.plan_size(seed, epoch, self.plan(seed, epoch, reader, readers, world_size))

    def plan_size(self, seed: int, epoch: int, plan: ConsumerPlan) -> int:
        """How many samples ``plan``, a plan of ``epoch``, reads (padding included); needs the
        per-shard counts."""
        counts = self._counts_in(self.order(seed, epoch))
        assert counts is not None
        pieces_size = sum(
            (counts[piece.pos] if piece.stop is None else piece.stop) - piece.first
            for span in plan.spans
            for piece in pieces(span)
        )
        return len(plan.leftovers) + pieces_size

    def redeal(
        self,
        seed: int,
        epoch: int,
        unread: Sequence[Span],
        leftovers: Sequence[Position],
        readers: int,
        world_size: int,
    ) -> list[ConsumerPlan]:
        """The unread rest of ``epoch`` dealt to ``readers`` new readers (see :func:`reshape`).
        The old plan's remainder decisions are in the rest already: on one rank it is read
        exactly once; across ranks the policy evens it out again, since ranks must yield the
        same number of batches."""
        counts = self._counts_in(self.order(seed, epoch))
        remainder = self.remainder_for(world_size) if world_size > 1 else "exact"
        return reshape(unread, leftovers, readers, counts, self.batch, self.partial, remainder)
