"""Batching and unbatching, with webdataset's collation (:mod:`wdsx.stages.collate`) and
checkpointable partial batches.

A batch is emitted as soon as it is full, so at every batch boundary the batcher holds nothing
and a checkpoint there is just the upstream state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.rows import RowColumn, join_columns
from wdsx.stages.base import Count, Run, Stage
from wdsx.stages.buffer import Buffer, attach_buffer
from wdsx.stages.collate import default_collation_fn
from wdsx.stages.filling import Filling


class Batched(Stage):
    """Group ``batchsize`` consecutive items and collate them (None: emit plain lists)."""

    state_key = "batched"
    state_type = Buffer

    def __init__(
        self, batchsize: int, collation_fn: Callable | None = default_collation_fn, partial: bool = True
    ):
        if batchsize < 1:
            raise ValueError(f"batch size must be positive, got {batchsize}")
        self.batchsize = batchsize
        self.collation_fn = collation_fn
        self.partial = partial
        self.batch_hint = (batchsize, partial)

    def describe(self) -> str:
        return f"batched({self.batchsize}, partial={self.partial})"

    def count_after(self, count: Count) -> Count | None:
        whole, rest = divmod(count.items, self.batchsize)
        if self.partial:
            return Count(whole + (1 if rest else 0), count.samples, False)
        if not count.single:
            return None
        return Count(whole, whole * self.batchsize, False)

    def _collate(self, items: list) -> Any:
        return items if self.collation_fn is None else self.collation_fn(items)

    def replay(self, item: Any) -> Any:
        return self._collate([item])

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        buffer = attach_buffer(run, index)
        batchsize = self.batchsize
        rows = self.collation_fn is default_collation_fn and run.source_index == index - 1
        fills = self.collation_fn is default_collation_fn and not rows
        held = _Held()
        filling: Filling | None = None  # this batch, collated while it fills, where that gains
        for item in upstream:
            buffer.positions.append(run.position)
            if filling is not None:
                filling.add(item)
            elif fills and not buffer.items and (filling := Filling.start(item, batchsize)) is not None:
                filling.add(item)
            else:
                buffer.items.append(item)
            if rows and run.rows is not None:
                yield from self._whole_batches(run, buffer, held)
            if len(buffer.positions) >= batchsize:
                batch, filling = self._emit(run, buffer, held, index, filling), None
                yield batch
        if buffer.positions and self.partial:
            yield self._emit(run, buffer, held, index, filling)
        buffer.items, buffer.positions = [], []

    def _emit(self, run: Run, buffer: Buffer, held: _Held, index: int, filling: Filling | None = None) -> Any:
        """The batch of everything ``buffer`` (or ``filling``) holds (after ``held``'s block, if
        any), which it then no longer holds; ``run.position`` says where its items came from."""
        items, positions = buffer.items, buffer.positions
        run.position = positions
        buffer.items, buffer.positions = [], []
        if filling is not None:
            return filling.result()
        if held.batch is None:
            return self._collate(items)
        block, held.batch = held.batch, None
        joined = join_columns(block, default_collation_fn(items)) if items else block
        if joined is not None:
            return joined
        # Rows that do not join the samples after them are read again as the samples they
        # were, and collated with those one by one: exactly what batching sample by sample gives.
        rows = run.reread(positions[: len(positions) - len(items)], index)
        return self._collate([*rows, *items])

    def _whole_batches(self, run: Run, buffer: Buffer, held: _Held) -> Iterator:
        """Batches that the reader right before this stage gathers whole from the rows it is
        reading (``run.rows``), the first one starting with what ``buffer`` holds: the same
        batches as collating sample by sample, without per-sample work. Where the piece ends
        before a batch is full, its last rows are gathered at once too and held, collated
        (``held``), until the next piece's rows complete the batch."""
        stamps = {EPOCH_SEED: run.epoch_seed}  # what the reader stamps on every sample
        while (rows := run.rows) is not None and rows.left() > 0:
            if not buffer.positions:  # at a batch boundary
                for batch, positions in rows.batches(self.batchsize, stamps):
                    run.position = cast(Any, positions)
                    yield batch
                if rows.left() == 0:
                    return
            elif not rows.joins:
                return
            head = held.batch
            if buffer.items:
                collated = default_collation_fn(buffer.items)
                head = collated if head is None else join_columns(head, collated)
                if head is None:
                    return
            wanted = self.batchsize - len(buffer.positions)
            block = rows.take(min(wanted, rows.left()), head, stamps)
            if block is None:
                return
            batch, positions = block
            buffer.items, held.batch = [], None
            if len(positions) < self.batchsize:
                held.batch, buffer.positions = batch, list(positions)
                return
            buffer.positions = []
            run.position = cast(Any, positions)
            yield batch


class _Held:
    """Rows a batching stage holds already collated: the end of a piece of a row shard, which
    the next piece's rows (or samples) complete into a batch. Their positions are the first
    of the stage's buffer."""

    __slots__ = ("batch",)

    def __init__(self) -> None:
        self.batch: dict[str, Any] | None = None


def batched(
    batchsize: int = 20, collation_fn: Callable | None = default_collation_fn, partial: bool = True
) -> Batched:
    """Batches of ``batchsize`` items; ``partial=False`` drops a short last batch."""
    return Batched(batchsize, collation_fn, partial)


def _rows(batch: Any) -> list:
    """The items of a collated batch (tuple/list of columns, or dict of columns)."""
    if isinstance(batch, dict):
        lengths = {len(column) for column in batch.values()}
        if len(lengths) != 1:
            raise ValueError(f"cannot unbatch a dict whose columns have lengths {sorted(lengths)}")
        return [{key: column[i] for key, column in batch.items()} for i in range(lengths.pop())]
    if isinstance(batch, (list, tuple)):
        return [tuple(column[i] for column in batch) for i in range(len(batch[0]))]
    raise ValueError(f"cannot unbatch a {type(batch).__name__}")


def _items(batch: Any) -> list:
    if not isinstance(batch, list):
        raise ValueError(f"unlisted expects lists, got {type(batch).__name__}")
    return batch


class Unbatched(Stage):
    """Split batches back into items (``rows``: how a batch splits)."""

    ends_batching = True
    state_key = "unbatched"
    state_type = Buffer

    def __init__(self, rows: Callable[[Any], list] = _rows, label: str = "unbatched"):
        self.rows = rows
        self.label = label

    def describe(self) -> str:
        return self.label

    def count_after(self, count: Count) -> Count | None:
        return count if count.single else Count(count.samples, count.samples)

    def replay(self, item: Any) -> Any:
        return self.rows(item)[0]

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        # The rows still to emit are held last-first, so that emitting one is a pop().
        buffer = attach_buffer(run, index, self.replay)
        while buffer.items:
            item, run.position = buffer.items.pop(), buffer.positions.pop()
            yield item
        for batch in upstream:
            positions = run.position
            if isinstance(positions, RowColumn):
                positions = list(positions)
            rows = self.rows(batch)
            if not isinstance(positions, list) or len(positions) != len(rows):
                positions = [None] * len(rows)
            buffer.items, buffer.positions = rows[::-1], positions[::-1]
            while buffer.items:
                item, run.position = buffer.items.pop(), buffer.positions.pop()
                yield item


def unbatched() -> Unbatched:
    """Turn batches (tuples or dicts of columns) back into single items."""
    return Unbatched()


def listed(batchsize: int, partial: bool = True) -> Batched:
    """Lists of ``batchsize`` items, not collated."""
    return Batched(batchsize, None, partial)


def unlisted() -> Unbatched:
    """Flatten lists back into items."""
    return Unbatched(_items, "unlisted")
