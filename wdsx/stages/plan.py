"""The stages a pipeline actually runs: the same items in the same order, with less work.

A pipeline's stages are what the user wrote, and what its fingerprint and checkpoints name.
Before each epoch the pipeline runs :func:`execution_stages` instead, which makes two
rewrites that cannot change a single output item:

* **Decode after the shuffle.** A ``decode`` (with wdsx's own handlers only) and the
  ``to_tuple``/``rename`` stages right before a ``shuffle`` run right after it. Each is a pure
  function of one sample that never drops it, and a shuffle's choices depend only on how many
  items it holds, never on what they are, so the shuffle emits the same samples in the same
  order, decoded. Its buffer then holds the small encoded samples instead of decoded images,
  and restoring it re-reads them without decoding them.
* **Decode into the batch.** ``decode`` → ``to_tuple``/``rename`` → ``batched`` (default
  collation) becomes one :class:`~wdsx.stages.decodebatch.DecodeBatched` stage that decodes
  each batch's images straight into the batch's array.

Every stage keeps its index in the list (a moved stage leaves a pass-through behind, and runs
inside the stage it follows), because stages derive their random streams and checkpoint names
from their index. Both rewrites apply only to stages with the default error handler (which
raises): a handler that skips samples would make them drop items. The one visible difference
is when a broken image raises: as it leaves the shuffle buffer rather than as it enters it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from wdsx.codecs import batchdecode
from wdsx.codecs.decode import Decoder, ImageHandler, basichandlers, gzfilter
from wdsx.core.errors import reraise_exception
from wdsx.stages.base import Run, Stage, source_index
from wdsx.stages.batch import Batched
from wdsx.stages.collate import default_collation_fn
from wdsx.stages.decodebatch import DecodeBatched
from wdsx.stages.shuffle import Shuffle, detshuffle
from wdsx.stages.transforms import Transform

Placed = tuple[int, Stage]
"""A stage in the order it runs, with the index (slot) it runs at."""


def execution_stages(stages: Sequence[Stage], decode_threads: int = 1) -> list[Stage]:
    """The stages to run for ``stages`` (see the module's description); batches decode their
    images on ``decode_threads`` threads."""
    start = source_index(stages)
    if start is None:
        return list(stages)
    order = _decode_after_shuffles(list(enumerate(stages)), start)
    order = _decode_into_batches(order, decode_threads)
    return _slots(order, len(stages))


def _pure_decode(stage: Stage) -> bool:
    """A decode stage with wdsx's own handlers, which are pure functions of the bytes."""
    if not isinstance(stage, Transform) or not isinstance(stage.fn, Decoder):
        return False
    return stage.handler is reraise_exception and all(
        handler is gzfilter or handler is basichandlers or isinstance(handler, ImageHandler)
        for handler in stage.fn.handlers
    )


def _structural(stage: Stage) -> bool:
    return isinstance(stage, Transform) and stage.structural and stage.handler is reraise_exception


def _decode_after_shuffles(order: list[Placed], start: int) -> list[Placed]:
    for position in range(len(order)):
        slot, stage = order[position]
        if type(stage) not in (Shuffle, detshuffle):  # (not a subclass that may do more)
            continue
        first = position
        while first > start + 1 and (_pure_decode(order[first - 1][1]) or _structural(order[first - 1][1])):
            first -= 1
        moved = [(slot, later) for _, later in order[first:position]]
        order[first : position + 1] = [order[position], *moved]
    return order


def _decode_into_batches(order: list[Placed], threads: int) -> list[Placed]:
    position = 0
    while position < len(order):
        decode = order[position][1]
        end = position + 1
        while end < len(order) and _structural(order[end][1]):
            end += 1
        if end < len(order) and _fusable(decode, order[end][1]):
            slot, batched = order[end]
            assert isinstance(decode, Transform) and isinstance(batched, Batched)
            between = [stage for _, stage in order[position + 1 : end] if isinstance(stage, Transform)]
            order[position : end + 1] = [(slot, DecodeBatched(decode, between, batched, threads))]
        position += 1
    return order


def _fusable(decode: Stage, batched: Stage) -> bool:
    return (
        _pure_decode(decode)
        and type(batched) is Batched
        and batched.collation_fn is default_collation_fn
        and any(batchdecode.defers(handler) for handler in decode.fn.handlers)  # type: ignore[attr-defined]
    )


def _slots(order: list[Placed], count: int) -> list[Stage]:
    """One stage per slot: what runs there, a pass-through where nothing does."""
    groups: list[list[Stage]] = [[] for _ in range(count)]
    for slot, stage in order:
        groups[slot].append(stage)
    return [_Passing() if not group else group[0] if len(group) == 1 else _Then(group) for group in groups]


class _Passing(Stage):
    """Where a transform that now runs elsewhere was."""

    state_key = "transform"

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return upstream

    def describe(self) -> str:
        return ""


class _Then(Stage):
    """A stage followed by transforms moved to run right after it, at its index."""

    def __init__(self, stages: list[Stage]):
        self.stages = stages
        self.state_key = stages[0].state_key or type(stages[0]).__name__.lower()  # type: ignore[misc]

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        for stage in self.stages:
            upstream = stage.apply(upstream, run, index)
        return upstream

    def replay(self, item: Any) -> Any:
        for stage in self.stages:
            item = stage.replay(item)
        return item

    def describe(self) -> str:
        return " + ".join(stage.describe() for stage in self.stages)
