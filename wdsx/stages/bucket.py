"""Bucketed batching: batches whose items share a size bucket, with bounded memory and exact state.

Training on sequences of very different lengths (or images of different aspect ratios) wastes
work on padding when a batch mixes short and long items. :func:`bucket` routes every item to a
bucket by a key (its length, its aspect ratio, a precomputed field) and emits a batch as soon
as one bucket holds ``batch_size`` items, so every batch's items share a bucket.

Memory is bounded twice: no bucket holds more than ``batch_size - 1`` items between two
outputs, and the stage never holds more than ``max_held`` items in all. When an arriving item
brings the total to ``max_held`` without filling its bucket, the fullest bucket is emitted as
a short batch (among equally full ones, the one that reached that size first), so a rare size
class cannot pin memory. At the end of the epoch the buckets still holding items are emitted
as short batches in the same order (fullest first), or dropped with ``partial=False``.

The state is, per bucket, the positions of the items it holds, in the order they arrived,
with the buckets in the order the stage would emit them: restoring reads those samples again
and replays the stages between the reader and this one (as for shuffle buffers), and an
elastic re-deal hands them to the new readers like any buffered sample.

How many batches a reader yields depends on the sizes it reads, so the deal cannot even out
batch counts across ranks as it does for ``batched`` (it still deals equal numbers of
samples): DDP jobs give the epoch a length in batches with ``with_epoch(n)``.
"""

from __future__ import annotations

import bisect
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from wdsx.stages.base import Run, Stage
from wdsx.stages.buffer import Buffer
from wdsx.stages.collate import default_collation_fn
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable

BucketId = int | str
"""What names a bucket: its index among the ranges ``boundaries`` cut, or the value a key
returns when there are no boundaries."""


class BucketState:
    """The buckets a :class:`Bucket` stage holds (each a :class:`~wdsx.stages.buffer.Buffer`
    of items and the positions they were read from), and, for each size, the buckets of that
    size in the order they reached it: so the fullest bucket, the one to emit when memory runs
    short, is found without looking at every bucket.

    JSON: ``{"buckets": [[id, count], ...], "positions": packed}``, the buckets in the order
    they would be emitted (:meth:`order`), ``positions`` packing their positions one bucket
    after the other."""

    __slots__ = ("buckets", "queues")

    def __init__(self) -> None:
        self.buckets: dict[BucketId, Buffer] = {}
        self.queues: list[dict[BucketId, None]] = [{}]
        """``queues[n]``: the buckets holding ``n`` items, in the order they reached ``n``."""

    def add(self, bucket_id: BucketId, item: Any, position: Any) -> int:
        """Put ``item`` (read at ``position``) in bucket ``bucket_id``; returns its new size."""
        bucket = self.buckets.get(bucket_id)
        if bucket is None:
            bucket = self.buckets[bucket_id] = Buffer()
        else:
            del self.queues[len(bucket.positions)][bucket_id]
        bucket.items.append(item)
        bucket.positions.append(position)
        size = len(bucket.positions)
        if size == len(self.queues):
            self.queues.append({})
        self.queues[size][bucket_id] = None
        return size

    def clear(self) -> None:
        """Drop everything held (the end of an epoch with ``partial=False``)."""
        self.buckets.clear()
        self.queues = [{}]

    def take(self, bucket_id: BucketId) -> Buffer:
        """Remove bucket ``bucket_id`` and return what it holds."""
        bucket = self.buckets.pop(bucket_id)
        del self.queues[len(bucket.positions)][bucket_id]
        return bucket

    def order(self) -> list[BucketId]:
        """The buckets, fullest first; among equally full ones, the first to reach that size first."""
        return [bucket_id for queue in reversed(self.queues) for bucket_id in queue]

    def fullest(self) -> BucketId:
        """The bucket to emit first (that :meth:`order` lists first); there must be one."""
        return next(bucket_id for queue in reversed(self.queues) for bucket_id in queue)

    def to_json(self, table: PositionTable) -> JsonDict:
        sizes = [[bucket_id, len(self.buckets[bucket_id].positions)] for bucket_id in self.order()]
        return {"buckets": sizes, "positions": table.encode(self.held())}

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> BucketState:
        data = validate.mapping(data)
        sizes = validate.listing(data, "buckets")
        positions = validate.positions(data, "positions", table)
        state = cls()
        start = 0
        with validate.within("buckets"):
            for index, entry in enumerate(sizes):
                bucket_id, count = _bucket_entry(entry, index)
                if bucket_id in state.buckets:
                    raise validate.invalid(index, "a bucket listed once", entry)
                for position in positions[start : start + count]:
                    state.add(bucket_id, None, position)  # the stage reads the items again
                start += count
        if start != len(positions):
            raise validate.invalid(
                "positions",
                f"the {start} positions the bucket sizes add up to",
                validate.Described(f"{len(positions)} positions"),
            )
        return state

    def held(self) -> list[Position]:
        return [position for bucket_id in self.order() for position in self.buckets[bucket_id].positions]


def _bucket_entry(entry: Any, index: int) -> tuple[BucketId, int]:
    """One ``[id, count]`` pair of a saved :class:`BucketState`: an integer or string id, and
    a count of at least one (empty buckets are not kept)."""
    if not isinstance(entry, list) or len(entry) != 2:
        raise validate.invalid(index, "a pair [bucket id, count]", entry)
    bucket_id, count = entry
    if type(bucket_id) not in (int, str):
        raise validate.invalid(index, "a bucket id that is an integer or a string", bucket_id)
    with validate.within(index):
        validate.check_integer(count, 1, low=1)
    return bucket_id, count


class Bucket(Stage):
    """Batches of ``batch_size`` items that share a bucket; see :func:`bucket`."""

    state_key = "bucket"
    state_type = BucketState
    ends_batching = True
    """How many batches a reader yields depends on the data, so batching stages after this one
    say nothing the deal could use to even out batch counts."""

    def __init__(
        self,
        key: Callable[[Any], Any],
        boundaries: Sequence[float] | None,
        batch_size: int,
        max_held: int | None = None,
        partial: bool = True,
        collation_fn: Callable | None = default_collation_fn,
    ):
        if batch_size < 1:
            raise ValueError(f"bucket: batch_size must be positive, got {batch_size}")
        if boundaries is not None:
            boundaries = list(boundaries)
            if any(low >= high for low, high in zip(boundaries, boundaries[1:])):
                raise ValueError(f"bucket: boundaries must increase strictly, got {boundaries}")
        if max_held is None and boundaries is None:
            raise ValueError(
                "bucket: without boundaries the key names the buckets, which may be any number: "
                "give max_held, the most items to hold at once"
            )
        if max_held is not None and max_held < batch_size:
            raise ValueError(f"bucket: max_held ({max_held}) must be at least batch_size ({batch_size})")
        self.key = key
        self.boundaries = boundaries
        self.batch_size = batch_size
        self.max_held = max_held
        self.partial = partial
        self.collation_fn = collation_fn

    def describe(self) -> str:
        name = getattr(self.key, "__qualname__", type(self.key).__name__)
        return (
            f"bucket({name}, boundaries={self.boundaries}, batch_size={self.batch_size}, "
            f"max_held={self.max_held}, partial={self.partial})"
        )

    def held_limit(self) -> int:
        """The most items this stage ever holds: ``max_held``, or, when there is none, one short
        of a batch in every bucket that ``boundaries`` cut (which then bounds it by itself)."""
        if self.max_held is not None:
            return self.max_held
        assert self.boundaries is not None
        return (len(self.boundaries) + 1) * (self.batch_size - 1)

    def bucket_of(self, item: Any) -> BucketId:
        """The bucket ``item`` belongs to: with boundaries ``[b0, b1, ...]``, bucket 0 takes
        keys below ``b0``, bucket ``i`` keys from ``b(i-1)`` up to (not including) ``bi``, and
        the last bucket keys from the last boundary up; without, the key itself."""
        value = self.key(item)
        if self.boundaries is not None:
            return bisect.bisect_right(self.boundaries, value)
        if type(value) is int or isinstance(value, str):
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):  # numpy integers
            return int(value)
        raise TypeError(
            f"bucket: without boundaries the key must return a bucket id (an integer or a string), "
            f"got {value!r} ({type(value).__name__})"
        )

    def replay(self, item: Any) -> Any:
        return self._collate([item])

    def _collate(self, items: list) -> Any:
        return items if self.collation_fn is None else self.collation_fn(items)

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        state, restored = run.attach(index, BucketState)
        if restored:
            self._refill(state, run, index)
        batch_size, limit = self.batch_size, self.max_held
        held = sum(len(bucket.positions) for bucket in state.buckets.values())
        for item in upstream:
            bucket_id = self.bucket_of(item)
            held += 1
            if state.add(bucket_id, item, run.position) >= batch_size:
                held -= batch_size
                yield self._emit(run, state, bucket_id)
            elif limit is not None and held >= limit:
                fullest = state.fullest()
                held -= len(state.buckets[fullest].positions)
                yield self._emit(run, state, fullest)
        while state.buckets and self.partial:
            yield self._emit(run, state, state.fullest())
        state.clear()

    def _emit(self, run: Run, state: BucketState, bucket_id: BucketId) -> Any:
        """The batch of everything bucket ``bucket_id`` holds, which ``state`` then no longer
        holds (so that a state taken after this batch does not hold its items)."""
        bucket = state.take(bucket_id)
        run.position = bucket.positions
        return self._collate(bucket.items)

    def check_state(self, state: BucketState) -> None:
        """Refuse buckets this stage could not hold: a full one, an id outside the boundaries'
        ranges, more items than the cap."""
        total = 0
        for bucket_id, bucket in state.buckets.items():
            count = len(bucket.positions)
            total += count
            if count >= self.batch_size:
                raise validate.InvalidState(
                    ["buckets"],
                    f"buckets of fewer than {self.batch_size} items (the batch size)",
                    validate.Described(f"{count} items in bucket {bucket_id!r}"),
                )
            if self.boundaries is not None and not (
                type(bucket_id) is int and 0 <= bucket_id <= len(self.boundaries)
            ):
                raise validate.InvalidState(
                    ["buckets"],
                    f"bucket ids from 0 to {len(self.boundaries)} (one per range the boundaries cut)",
                    bucket_id,
                )
        if total > self.held_limit():
            raise validate.InvalidState(
                ["buckets"],
                f"at most {self.held_limit()} items held in all",
                validate.Described(f"{total} items"),
            )

    def _refill(self, state: BucketState, run: Run, index: int) -> None:
        """Read again the items a restored ``state`` holds (checked again: a re-dealt state
        does not pass through ``load_state_dict``)."""
        with validate.within("stages", run.keys[index]):
            self.check_state(state)
        items = iter(run.reread(state.held(), index))
        for bucket_id in state.order():
            bucket = state.buckets[bucket_id]
            bucket.items = [next(items) for _ in bucket.positions]


def bucket(
    key: Callable[[Any], Any],
    boundaries: Sequence[float] | None,
    batch_size: int,
    *,
    max_held: int | None = None,
    partial: bool = True,
    collation_fn: Callable | None = default_collation_fn,
) -> Bucket:
    """Batches of ``batch_size`` items whose keys fall in the same bucket.

    Args:
        key: a function of an item (as the stage before this one yields it): a number such as
            a sequence length when ``boundaries`` are given, else the bucket id itself (an
            integer or a string). It must depend on the item alone, for exact resume.
        boundaries: increasing numbers cutting keys into ``len(boundaries) + 1`` buckets:
            ``[64, 128]`` makes buckets of keys below 64, from 64 below 128, and 128 up. None:
            the key returns the bucket id.
        batch_size: a bucket holding this many items is emitted as a batch at once.
        max_held: the most items held in all buckets together; reaching it emits the fullest
            bucket as a short batch. Required without boundaries; with them it defaults to
            ``(len(boundaries) + 1) * (batch_size - 1)``, which never forces a short batch.
        partial: at the end of the epoch, emit the buckets still holding items as short
            batches (True) or drop those items (False).
        collation_fn: how a list of items becomes a batch, as in ``batched``; None emits
            plain lists.
    """
    return Bucket(key, boundaries, batch_size, max_held, partial, collation_fn)
