"""The stage protocol and the per-epoch run context that stages share.

A pipeline is a list of stages. Each epoch the pipeline creates a :class:`Run` and chains the
stages: ``stage.apply(upstream, run, index)`` returns the stage's output iterator. Stages that
keep nothing (map, decode, to_tuple...) are plain generators. The few that hold samples
(the shard reader, shuffle buffers, batchers) register a state object with the run, whose
``snapshot()`` describes what they hold in terms of sample *positions*; restoring re-reads
those positions and replays the stages in between (:meth:`Stage.replay`).

Position side channel: the stage that produces samples from shards sets ``run.position`` to
the position of each sample as it yields it; a buffering stage reads ``run.position`` right
after pulling an item, so items carry no extra fields and 1:1 stages need no bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from wdsx.core import topology as distributed
from wdsx.state.checkpoint import PositionTable

Position = tuple
"""``(url, byte_offset, ordinal)``, with a fourth element ``True`` for padding samples."""


class Run:
    """Context of one epoch of one pipeline in one reading stream."""

    def __init__(
        self,
        stages: list[Stage],
        epoch: int,
        seed: int,
        topology: distributed.Topology,
        restore: dict[int, Any] | None = None,
        table: PositionTable | None = None,
    ):
        self.stages = stages
        self.epoch = epoch
        self.seed = seed
        self.topology = topology
        self.restore = restore or {}
        self.table = table or PositionTable()
        self.position: Position | list | None = None
        self.states: dict[int, Any] = {}
        self.source_index = source_index(stages)

    def register(self, index: int, state: Any) -> Any:
        """Record a stage's state object; returns the saved state to restore from, if any."""
        self.states[index] = state
        return self.restore.get(index)

    def reread(self, positions: list[Position], upto: int) -> list[Any]:
        """Re-create items that stage ``upto`` held: read the samples at ``positions`` again and
        pass each through the stages between the sample source and stage ``upto``."""
        if not positions:
            return []
        if self.source_index is None:
            raise RuntimeError("no sample source in this pipeline to re-read positions from")
        samples = self.stages[self.source_index].read_positions(positions)
        return replay(samples, self.stages[self.source_index + 1 : upto])


def source_index(stages: Sequence[Stage]) -> int | None:
    """Index of the stage that reads shards into positioned samples, if there is one."""
    return next((i for i, stage in enumerate(stages) if stage.produces_samples), None)


def replay(items: Iterable[Any], stages: Sequence[Stage]) -> list[Any]:
    """``items`` as they would come out of ``stages`` (each taken as a 1:1 transformation)."""
    replayers = [stage.replay for stage in stages]
    results = []
    for item in items:
        for redo in replayers:
            item = redo(item)
        results.append(item)
    return results


class Stage:
    """One step of a pipeline. Subclasses implement :meth:`apply`."""

    produces_samples = False
    """True for the stage that reads shards into positioned samples (the reader/expander)."""

    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        raise NotImplementedError

    def replay(self, item: Any) -> Any:
        """Redo this stage's effect on one item (used to rebuild restored buffers). Stages that
        only reorder, hold or filter items return the item unchanged."""
        return item

    def describe(self) -> str:
        """A short text identifying the stage and its parameters, for state fingerprints."""
        return type(self).__name__

    def not_resumable(self) -> str | None:
        """Why a checkpoint cannot capture this stage exactly, or None when it can."""
        return None

    def __call__(self, src: Iterator | None = None) -> Iterator:
        """webdataset's curried-filter protocol: ``wds.map(f)(samples)`` on a plain iterator."""
        run = Run([self], 0, 0, distributed.current())
        return self.apply(iter(src) if src is not None else None, run, 0)


class CallableStage(Stage):
    """A plain function of an iterator (or of nothing, for a source), as webdataset allows."""

    def __init__(self, fn: Callable, stateless: bool = False):
        self.fn = fn
        self.stateless = stateless or getattr(fn, "__wdsx_stateless__", False)

    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        return iter(self.fn() if upstream is None else self.fn(upstream))

    def replay(self, item: Any) -> Any:
        outputs = list(self.fn(iter([item])))
        if len(outputs) != 1:
            raise RuntimeError(f"{self.describe()} did not map one item to one item while restoring a buffer")
        return outputs[0]

    def describe(self) -> str:
        return f"callable({getattr(self.fn, '__qualname__', type(self.fn).__name__)})"

    def not_resumable(self) -> str | None:
        if self.stateless:
            return None
        return (
            f"{self.describe()} is an opaque function of the stream; if it neither buffers nor reorders "
            "items, mark it with wdsx.stateless(fn)"
        )


class IterableSource(Stage):
    """An iterable (a list, a Dataset, a DataLoader) used as the first stage."""

    def __init__(self, iterable: Any):
        self.iterable = iterable

    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        return iter(self.iterable)

    def describe(self) -> str:
        return f"iterable({type(self.iterable).__name__})"

    def not_resumable(self) -> str | None:
        return f"{self.describe()} is an opaque source; wdsx can only replay it from the start"


def stateless(fn: Callable) -> Callable:
    """Declare that a function of the stream neither buffers nor reorders items (1:1 or a
    filter), so wdsx can checkpoint a pipeline that contains it."""
    fn.__wdsx_stateless__ = True
    return fn


def as_stage(item: Any) -> Stage:
    """Turn anything webdataset accepts as a pipeline step into a :class:`Stage`."""
    if isinstance(item, Stage):
        return item
    if isinstance(item, list) or (hasattr(item, "__iter__") and not callable(item)):
        return IterableSource(item)
    if callable(item):
        return CallableStage(item)
    raise ValueError(f"{item!r}: not a valid pipeline stage")


def pipelinefilter(f: Callable) -> Callable[..., Stage]:
    """webdataset's decorator: ``pipelinefilter(f)(*args)`` is a stage running ``f(src, *args)``."""

    def make_stage(*args: Any, **kwargs: Any) -> Stage:
        def run_f(src: Iterator) -> Iterator:
            return f(src, *args, **kwargs)

        run_f.__qualname__ = getattr(f, "__qualname__", "filter")
        return CallableStage(run_f)

    return make_stage
