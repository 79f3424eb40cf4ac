"""The stage protocol and the per-epoch run context that stages share.

A pipeline is a list of stages. Each epoch the pipeline creates a :class:`Run` and chains the
stages: ``stage.apply(upstream, run, index)`` returns the stage's output iterator. Stages that
keep nothing (map, decode, to_tuple...) are plain generators. The few that keep something
(the shard reader, shuffle buffers, batchers, counters) attach a typed state to the run
(:meth:`Run.attach`), whose JSON form the checkpoint stores under the stage's stable key. A
buffer's state is the *positions* of what it holds; restoring re-reads those samples and
replays the stages in between (:meth:`Run.reread`).

Position side channel: samples carry their :class:`~wdsx.state.position.Position` in the
``__position__`` field, but later stages may drop fields or turn samples into tuples. So the
stage that produces samples also sets ``run.position`` as it yields each one, and every stage
that holds or reorders items keeps ``run.position`` pointing at the position(s) of the item it
yields last: a buffering stage reads it right after pulling an item, and 1:1 stages need no
bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from wdsx.core import topology as topologies
from wdsx.core.redact import redact
from wdsx.core.sampleseed import epoch_seed, stamp
from wdsx.read.deal import EpochDeal
from wdsx.read.rows import RowSource
from wdsx.state.checkpoint import JsonDict, PipelineState, StageState
from wdsx.state.position import Position, PositionTable

S = TypeVar("S", bound=StageState)


@dataclass(frozen=True)
class Count:
    """How many items a stage yields in one epoch, and how many samples they hold."""

    items: int
    samples: int
    single: bool = True
    """Each item is one sample (not a batch)."""


@dataclass(frozen=True)
class RedealTarget:
    """The topology a checkpoint is re-dealt from and to."""

    old_world_size: int
    readers: int
    world_size: int


class Run:
    """Context of one epoch of one pipeline in one reading stream."""

    def __init__(
        self,
        stages: list[Stage],
        epoch: int,
        seed: int,
        topology: topologies.Topology,
        restore: PipelineState | None = None,
        table: PositionTable | None = None,
    ):
        self.stages = stages
        self.keys = stage_keys(stages)
        self.epoch = epoch
        self.seed = seed
        self.topology = topology
        self.restore = restore
        self.table = table or PositionTable()
        self.position: Position | list[Position | None] | None = None
        self.rows: RowSource | None = None
        """The piece of a shard being read, when it can hand out whole batches (``.npy`` rows)."""
        self.states: dict[str, StageState] = {}
        self.source_index = source_index(stages)
        self.epoch_seed = epoch_seed(seed, epoch)
        """What the reader stamps on each sample, for per-sample randomness (``wdsx.sample_rng``)."""

    def attach(self, index: int, kind: type[S]) -> tuple[S, bool]:
        """A fresh state of type ``kind`` for stage ``index``, or the one the checkpoint holds,
        registered so that checkpoints include it. Returns ``(state, restored)``.

        Stages before the sample source (shard-list shuffles and splitters) are replayed from
        the start of the epoch on resume, so their states are neither saved nor restored."""
        if self.before_source(index):
            return kind(), False
        key = self.keys[index]
        saved = self.restore.stages.get(key) if self.restore is not None else None
        state = kind() if saved is None else kind.from_json(saved, self.table)
        self.states[key] = state
        return state, saved is not None

    def before_source(self, index: int) -> bool:
        """True for a stage that works on the shard list, before the stage reading shards."""
        return self.source_index is not None and index < self.source_index

    def snapshot(self) -> dict[str, JsonDict]:
        """Every attached stage state as JSON, by stage key."""
        return {key: state.to_json(self.table) for key, state in self.states.items()}

    def reread(self, positions: list[Position], upto: int) -> list[Any]:
        """Re-create items that stage ``upto`` held (see :func:`reread`)."""
        return reread(self.stages, positions, self.epoch_seed, upto)


def stage_keys(stages: Sequence[Stage]) -> list[str]:
    """Each stage's checkpoint key: its :attr:`Stage.state_key`, numbered from the second
    stage of the same kind on (``"shuffle"``, ``"shuffle.2"``), so that adding or removing a
    stage of another kind leaves the keys alone."""
    seen: dict[str, int] = {}
    keys = []
    for stage in stages:
        base = stage.state_key or type(stage).__name__.lower()
        seen[base] = seen.get(base, 0) + 1
        keys.append(base if seen[base] == 1 else f"{base}.{seen[base]}")
    return keys


def source_index(stages: Sequence[Stage]) -> int | None:
    """Index of the stage that reads shards into positioned samples, if there is one."""
    return next((i for i, stage in enumerate(stages) if stage.produces_samples), None)


def reread(
    stages: Sequence[Stage], positions: Sequence[Position], seed: int | None, upto: int | None = None
) -> list[Any]:
    """The items at ``positions`` as stage ``upto`` of ``stages`` received them (None: as the
    last stage delivered them): the samples read again by the sample source, stamped with the
    epoch seed ``seed`` as a reader stamps them (None where that epoch cannot be known), and
    passed through the stages between."""
    if not positions:
        return []
    index = source_index(stages)
    if index is None:
        raise RuntimeError("no sample source in this pipeline to re-read positions from")
    source = stages[index]
    samples = source.read_positions(positions)
    if source.reads_shards:
        stamp(samples, seed)
    return replay(samples, stages[index + 1 : upto])


def replay(items: Iterable[Any], stages: Sequence[Stage]) -> list[Any]:
    """``items`` as they would come out of ``stages`` (each taken as a 1:1 transformation)."""
    replayers = [stage.replay for stage in stages]
    results = []
    for item in items:
        for redo in replayers:
            item = redo(item)
        results.append(item)
    return results


def batch_hint(stages: Sequence[Stage], index: int) -> tuple[int, bool]:
    """Batch size and partial flag of the first batching stage after stage ``index``, so that
    dealt shares can give every reader the same number of batches."""
    for stage in stages[index + 1 :]:
        if stage.batch_hint is not None:
            return stage.batch_hint
        if stage.ends_batching:
            break
    return 1, True


class Stage:
    """One step of a pipeline. Subclasses implement :meth:`apply`."""

    produces_samples: ClassVar[bool] = False
    """True for the stage that reads shards into positioned samples (the reader/expander)."""

    reads_shards: ClassVar[bool] = False
    """True for a stage whose :meth:`read_positions` returns samples as a shard reader makes
    them, which the run stamps with its epoch seed as the reader stamps fresh ones."""

    state_type: ClassVar[type[StageState] | None] = None
    """The type of state this stage attaches to a run, if it keeps one."""

    batch_hint: tuple[int, bool] | None = None
    """(batch size, partial) for a stage that batches, so readers deal equal batch counts."""

    ends_batching: ClassVar[bool] = False
    """True for a stage after which batch sizes no longer say anything (unbatching)."""

    state_key: ClassVar[str] = ""
    """The stable name of this stage's state in checkpoints (see :func:`stage_keys`); empty
    means the class name in lower case."""

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        """This stage's output for one epoch, given the previous stage's output (an empty
        iterator for the first stage) and its own ``index`` in ``run.stages``."""
        raise NotImplementedError

    def replay(self, item: Any) -> Any:
        """Redo this stage's effect on one item (used to rebuild restored buffers). Stages that
        only reorder, hold or filter items return the item unchanged."""
        return item

    def read_positions(self, positions: Sequence[Position]) -> list[Any]:
        """The samples at ``positions``, read again (only the stage that produces samples)."""
        raise NotImplementedError(f"{self.describe()} does not read samples")

    def epoch_deal(self, stages: Sequence[Stage], index: int) -> EpochDeal | None:
        """How this stage, as stage ``index`` of ``stages``, deals epochs to readers: None
        unless it reads a fixed shard list (re-dealing a checkpoint needs one)."""
        return None

    def count_after(self, count: Count) -> Count | None:
        """What this stage yields in an epoch given ``count`` from upstream; None when that
        cannot be known in advance (filters, opaque functions)."""
        return None

    def source_count(self, stages: Sequence[Stage], index: int, run: Run) -> Count | None:
        """For the stage that produces a pipeline's items: what it yields in ``run``'s epoch
        for ``run``'s reader (None when unknown)."""
        return None

    def shard_urls(self) -> Sequence[str] | None:
        """The shard URLs this stage reads samples from, when it reads a fixed list."""
        return None

    def redeal_states(
        self,
        states: Sequence[PipelineState],
        leftovers: Sequence[Position],
        stages: Sequence[Stage],
        index: int,
        readers: RedealTarget,
    ) -> list[PipelineState] | None:
        """This stage's own way of dealing the unread rest of an epoch, saved as ``states``
        by the old readers, to ``readers`` new ones; None when the generic re-deal of a
        stage with an :meth:`epoch_deal` applies."""
        return None

    def carried_state(
        self, saved: Sequence[tuple[JsonDict | None, PositionTable]], table: PositionTable
    ) -> JsonDict | None:
        """The state every new reader of an elastic re-deal gives this stage, from the old
        readers' ``saved`` states (each with its URL table), positions written against
        ``table``; None (as for most stages) to start afresh. A stage whose held samples were
        partly passed on (a packer's split documents) says here which part."""
        return None

    def check_state(self, state: Any) -> None:
        """Refuse (with :class:`~wdsx.state.validate.InvalidState`, its path relative to this
        stage's state) a parsed ``state`` of :attr:`state_type` that this stage, as built, could
        not have written: called by ``load_state_dict`` before any worker starts, so that a bad
        checkpoint never fails at iteration time. Most stages' states are checked whole by their
        type's parser."""

    def redealt(self, saved: JsonDict | None, table: PositionTable) -> bool:
        """For the stage that reads samples: whether a saved state of it holds a share re-dealt
        by an elastic resume (whose items are counted from the re-deal on)."""
        return False

    def held_positions(self, saved: JsonDict | None, table: PositionTable) -> list[Position]:
        """Positions of the samples a saved state of this stage holds, not yet passed on."""
        if saved is None or self.state_type is None:
            return []
        return self.state_type.from_json(saved, table).held()

    def upgrade_state(self, saved: JsonDict, table: PositionTable) -> JsonDict:
        """This stage's state from a version-2 checkpoint, in today's form (most stages kept
        theirs unchanged)."""
        return saved

    def describe(self) -> str:
        """A short text identifying the stage and its parameters, for state fingerprints."""
        return type(self).__name__

    def not_resumable(self) -> str | None:
        """Why a checkpoint cannot capture this stage exactly, or None when it can."""
        return None

    def not_replayable(self) -> str | None:
        """Why running this stage again from the start of the epoch, as a resumed run does
        with the stages before the shard reader, might not give the items it gave, or None."""
        return None

    def __repr__(self) -> str:
        """The stage as a pipeline's repr lists it: its description, unless it has a shorter one."""
        return self.describe()

    def __call__(self, src: Iterable | None = None) -> Iterator:
        """webdataset's curried-filter protocol: ``wds.map(f)(samples)`` on a plain iterator
        (without one, the stage runs as the first stage of a pipeline)."""
        stages: list[Stage] = [self] if src is None else [IterableSource(src), self]
        run = Run(stages, 0, 0, topologies.current())
        upstream = iter(()) if src is None else iter(src)
        return self.apply(upstream, run, len(stages) - 1)


class CallableStage(Stage):
    """A plain function of an iterator, or of nothing when it is the first stage (a source),
    as webdataset allows."""

    def __init__(self, fn: Callable, stateless: bool = False, name: str | None = None):
        self.fn = fn
        self.stateless = stateless or getattr(fn, "__wdsx_stateless__", False)
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return iter(self.fn() if index == 0 else self.fn(upstream))

    def replay(self, item: Any) -> Any:
        outputs = list(self.fn(iter([item])))
        if len(outputs) != 1:
            raise RuntimeError(f"{self.describe()} did not map one item to one item while restoring a buffer")
        return outputs[0]

    def describe(self) -> str:
        return f"callable({self.name})"

    def __repr__(self) -> str:
        return str(self.name)

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

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return iter(self.iterable)

    def describe(self) -> str:
        return f"iterable({type(self.iterable).__name__})"

    def not_resumable(self) -> str | None:
        return f"{self.describe()} is an opaque source; wdsx can only replay it from the start"


def shards_summary(urls: Sequence[str]) -> str:
    """A shard list as a stage's repr shows it: how many, and the first (``3 shards from a.tar``)."""
    if not urls:
        return "no shards"
    first = redact(urls[0])
    return f"1 shard {first}" if len(urls) == 1 else f"{len(urls)} shards from {first}"


F = TypeVar("F", bound=Callable)


def stateless(fn: F) -> F:
    """Declare that a function of the stream neither buffers nor reorders items (1:1 or a
    filter), so wdsx can checkpoint a pipeline that contains it."""
    fn.__wdsx_stateless__ = True  # type: ignore[attr-defined]
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


class StageList(list[Stage]):
    """A pipeline's stages, a list as in webdataset: whatever goes into it (``append``,
    ``extend``, ``insert``, item or slice assignment, ``+=``) becomes a :class:`Stage` as
    :func:`as_stage` makes one, so code that builds or edits ``pipeline.pipeline`` directly
    (a subclass's ``__init__`` extending it, a splitter inserted after the shard list) builds
    the pipeline the constructor would."""

    def __init__(self, items: Iterable[Any] = ()):
        super().__init__(as_stage(item) for item in items)

    def append(self, item: Any) -> None:
        super().append(as_stage(item))

    def extend(self, items: Iterable[Any]) -> None:
        super().extend(as_stage(item) for item in items)

    def insert(self, index: Any, item: Any) -> None:
        super().insert(index, as_stage(item))

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, slice):
            super().__setitem__(index, [as_stage(item) for item in value])
        else:
            super().__setitem__(index, as_stage(value))

    def __iadd__(self, items: Iterable[Any]) -> StageList:  # type: ignore[misc, override]
        self.extend(items)
        return self


class FilterFunction:
    """``f`` with every argument but the first bound: calling it on ``data`` runs
    ``f(data, *args, **kw)``. Unlike a closure, it pickles (when ``f`` and the arguments
    do), so a pipeline holding it reaches workers started with ``spawn``."""

    def __init__(self, f: Callable, *args: Any, **kw: Any):
        self.f = f
        self.args = args
        self.kw = kw

    def __call__(self, data: Any) -> Any:
        return self.f(data, *self.args, **self.kw)

    def __repr__(self) -> str:
        return f"<{self.f.__name__} {self.args} {self.kw}>"


def pipelinefilter(f: Callable) -> Callable[..., Stage]:
    """webdataset's decorator: ``pipelinefilter(f)(*args)`` is a stage running ``f(src, *args)``."""

    def make_stage(*args: Any, **kwargs: Any) -> Stage:
        return CallableStage(FilterFunction(f, *args, **kwargs), name=getattr(f, "__qualname__", "filter"))

    return make_stage
