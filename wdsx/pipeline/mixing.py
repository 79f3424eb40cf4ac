"""Mixing several pipelines into one stream: weighted or round-robin, exactly resumable.

:class:`Mix` reads several pipelines (each with its own shards, shuffle, decoding and maps)
and draws each output from one of them. Which source output *i* of a reader comes from is a
pure function of (seed, epoch, reader, draw count) — or, round-robin, of the count alone — so
a checkpoint needs only the counts and each source's own state, and a resume replays nothing.

Stop rules: ``"first"`` ends the stream when a drawn source is exhausted (webdataset's
``longest=False``); ``"all"`` drops exhausted sources and goes on until every source is
exhausted (``longest=True``); ``"never"`` starts an exhausted source's next epoch (a new shard
order, its own epoch counter) and never ends. With ``batch_size``, each draw yields a whole
batch from one source (homogeneous batches).

Weights can follow a schedule (:mod:`wdsx.pipeline.schedules`): a function of the draws the
whole job has made in this epoch, counted as this reader's draws times the number of readers
plus the draws made before the last re-deal (``MixState.base``). Both counts are in the
checkpoint, so a resumed or re-dealt mixture goes on with the weights it would have had.

Each source is dealt across ranks and workers by its own reader, so under WebLoader every
reader mixes its own share of every source, and a checkpoint re-dealt to another topology
re-deals every source's unread rest (:mod:`wdsx.pipeline.redeal`).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from wdsx.core import rng
from wdsx.core.errors import StateError
from wdsx.core.topology import Topology
from wdsx.core.topology import current as current_topology
from wdsx.pipeline import redeal, schedules
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.schedules import WeightsOrSchedule
from wdsx.stages.base import Count, RedealTarget, Run, Stage, reread, source_index, stage_keys
from wdsx.stages.collate import default_collation_fn
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict, PipelineState
from wdsx.state.fingerprint import Identity
from wdsx.state.position import Position, PositionTable

STOP_RULES = ("first", "all", "never")
ORDERS = ("random", "round_robin")


@dataclass
class MixState:
    """A mixer's progress in one reader: its draw counts, which sources are still active, each
    source's epoch, how many outputs each gave, and each source pipeline's own state."""

    draws: int = 0
    """Random draws made so far (weighted order)."""
    turn: int = 0
    """Index into the active sources of the next round-robin turn."""
    base: int = 0
    """Draws the whole job made in this epoch before the readers were last re-dealt (0 until
    then): where a weight schedule's count starts for every reader."""
    delivered: list[int] = field(default_factory=list)
    active: list[bool] = field(default_factory=list)
    epochs: list[int] = field(default_factory=list)
    sources: list[JsonDict | None] = field(default_factory=list)
    """The sources' saved states (restored ones until they are loaded)."""
    live: list[DataPipeline | None] = field(default_factory=list, compare=False, repr=False)
    """The running source pipelines, whose states a checkpoint takes."""

    def reset(self, count: int, epoch: int) -> None:
        """Start an epoch of ``count`` sources at source epoch ``epoch``."""
        self.draws, self.turn, self.base = 0, 0, 0
        self.delivered, self.active = [0] * count, [True] * count
        self.epochs, self.sources, self.live = [epoch] * count, [None] * count, [None] * count

    def to_json(self, table: PositionTable) -> JsonDict:
        sources = [
            pipeline.current_state().to_json() if pipeline is not None else saved
            for pipeline, saved in zip(self.live, self.sources)
        ]
        data: JsonDict = {
            "draws": self.draws,
            "turn": self.turn,
            "delivered": list(self.delivered),
            "active": list(self.active),
            "epochs": list(self.epochs),
            "sources": sources,
        }
        if self.base:
            data["base"] = self.base
        return data

    def drawn(self, readers: int) -> int:
        """The draws the whole job has made in this epoch, as a weight schedule counts them:
        this reader's times the number of readers (who draw in turn), after ``base``."""
        return self.base + self.draws * readers

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> MixState:
        """The state :meth:`to_json` wrote: one entry per source in every list, each source's
        state an object or null (the mixture checks those against its sources)."""
        data = validate.mapping(data)
        sources = validate.listing(data, "sources")
        count = len(sources)
        for index, saved in enumerate(sources):
            if saved is not None and not isinstance(saved, dict):
                raise validate.InvalidState(["sources", index], "a source's state (an object) or null", saved)
        active = validate.listing(data, "active", length=count)
        for index, flag in enumerate(active):
            if type(flag) is not bool:
                raise validate.InvalidState(["active", index], "true or false", flag)
        return cls(
            validate.integer(data, "draws"),
            # a turn is counted after each output and wraps when the next one is chosen, so
            # a state between the two holds the number of sources
            validate.integer(data, "turn", high=count),
            validate.integer(data, "base", default=0),
            validate.integers(data, "delivered", length=count),
            list(active),
            validate.integers(data, "epochs", length=count),
            list(sources),
            [None] * count,
        )

    def held(self) -> list[Position]:
        """Between outputs the mixer holds nothing; the sources' buffers are in their states."""
        return []


class MixSource(Stage):
    """The first stage of a :class:`Mix`: draws items (or batches) from the source pipelines."""

    produces_samples = True
    state_key = "mix"
    state_type = MixState

    def __init__(
        self,
        sources: Sequence[DataPipeline],
        weights: WeightsOrSchedule,
        stop: str,
        order: str,
        batch_size: int | None,
        collation_fn: Callable | None,
        partial: bool,
    ):
        if not sources:
            raise ValueError("a mixture needs at least one source")
        if stop not in STOP_RULES:
            raise ValueError(f"stop must be one of {STOP_RULES}, got {stop!r}")
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.schedule: schedules.Schedule | None = weights if callable(weights) else None
        if self.schedule is not None:
            schedules.checked(self.schedule(0), len(sources), 0)
        fixed = weights if weights is not None and not callable(weights) else [1.0] * len(sources)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.sources = list(sources)
        self.weights = schedules.checked(fixed, len(sources))
        """The fixed weights (all 1 under a schedule, which gives them per draw instead)."""
        self.stop = stop
        self.order = order
        self.batch_size = batch_size
        self.collation_fn = collation_fn
        self.partial = partial

    def __repr__(self) -> str:
        """The sources and how they are mixed (``[WebDataset(...), WebDataset(...)],
        weights=[1.0, 2.0], stop='all'``); the order and batch size only when not the default."""
        text = f"[{', '.join(map(repr, self.sources))}], weights={self._weights_text()}, stop={self.stop!r}"
        text += f", order={self.order!r}" if self.order != "random" else ""
        return text + (f", batch_size={self.batch_size}" if self.batch_size is not None else "")

    def describe(self) -> str:
        inner = " | ".join(", ".join(source.fingerprint()) for source in self.sources)
        return (
            f"mix({self.order}, weights={self._weights_text()}, stop={self.stop}, "
            f"batch={self.batch_size}, sources=[{inner}])"
        )

    def _weights_text(self) -> str:
        return schedules.describe(self.schedule) if self.schedule is not None else str(self.weights)

    def not_resumable(self) -> str | None:
        reasons = [f"source {k}: {r}" for k, s in enumerate(self.sources) for r in s.not_resumable()]
        return "; ".join(reasons) if reasons else None

    def source_count(self, stages: Sequence[Stage], index: int, run: Run) -> Count | None:
        """Under ``stop="all"`` a reader yields all of its share of every source."""
        if self.stop != "all":
            return None
        restore = run.restore
        saved = None if restore is None else restore.stages.get(run.keys[index])
        mix = None if restore is None or saved is None else MixState.from_json(saved, restore.table())
        # a re-dealt source's share is counted from the re-deal, as for a single source
        counts = [
            source.share_count(run.topology, run.epoch, None if mix is None else mix.sources[k])
            for k, source in enumerate(self.sources)
        ]
        samples = sum(c.samples for c in counts)
        if self.batch_size is None:
            return Count(sum(c.items for c in counts), samples, all(c.single for c in counts))
        whole = [divmod(c.items, self.batch_size) for c in counts]
        return Count(sum(n + (1 if rest and self.partial else 0) for n, rest in whole), samples, False)

    def shard_urls(self) -> list[str]:
        return [url for k in range(len(self.sources)) for url in self._urls_of(k)]

    def _urls_of(self, k: int) -> Sequence[str]:
        stages = self.sources[k].pipeline
        index = source_index(stages)
        return (stages[index].shard_urls() or ()) if index is not None else ()

    def upgrade_state(self, saved: JsonDict, table: PositionTable) -> JsonDict:
        raise StateError("mixtures did not exist in version-2 checkpoints")

    # --- mixing -----------------------------------------------------------------------
    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        state, restored = run.attach(index, MixState)
        if not restored:
            state.reset(len(self.sources), run.epoch)
        seed = rng.derive_seed("mix", run.seed, run.epoch, run.topology.consumer)
        return self._mix(run, state, seed)

    def _weights_now(self, state: MixState, readers: int) -> Sequence[float]:
        """The sources' weights for the next draw: fixed, or the schedule's at the count so far."""
        if self.schedule is None:
            return self.weights
        drawn = state.drawn(readers)
        return schedules.checked(self.schedule(drawn), len(self.sources), drawn)

    def _start(self, state: MixState, k: int) -> Iterator:
        """Source ``k`` running in this reader: from its saved state, or at its epoch."""
        pipeline = self.sources[k].detached()
        saved = state.sources[k]
        if saved is not None:
            pipeline.load_state_dict(saved)
        else:
            pipeline.set_epoch(state.epochs[k])
        state.live[k] = pipeline
        return iter(pipeline)

    def _next_source(self, state: MixState, seed: int, readers: int) -> int | None:
        """The source of the next output, or None when none is active."""
        active = [k for k, alive in enumerate(state.active) if alive]
        if not active:
            return None
        if self.order == "round_robin":
            state.turn %= len(active)
            return active[state.turn]
        weights = self._weights_now(state, readers)
        bounds = list(itertools.accumulate(weights[k] for k in active))
        if not bounds[-1] > 0:  # every active source has weight 0: draw among them equally
            bounds = list(range(1, len(active) + 1))
        point = rng.uniform(seed, state.draws) * bounds[-1]
        state.draws += 1
        return active[min(bisect.bisect_right(bounds, point), len(active) - 1)]

    def _pull(self, state: MixState, iterators: list[Iterator | None], k: int) -> tuple[bool, Any]:
        """The next item of source ``k``; under ``stop="never"`` an exhausted source starts its
        next epoch (one that yields nothing at all leaves the mixture for this reader)."""
        for attempt in range(2):
            iterator = iterators[k]
            if iterator is None:
                iterator = iterators[k] = self._start(state, k)
            item = next(iterator, _END)
            if item is not _END:
                return True, item
            if self.stop != "never" or attempt == 1:
                return False, None
            state.epochs[k] += 1
            state.sources[k], iterators[k] = None, None
        return False, None

    def _position(self, state: MixState, k: int) -> Any:
        pipeline = state.live[k]
        return pipeline.current_position() if pipeline is not None else None

    def _mix(self, run: Run, state: MixState, seed: int) -> Iterator:
        iterators: list[Iterator | None] = [None] * len(self.sources)
        try:
            while True:
                k = self._next_source(state, seed, run.topology.consumers)
                if k is None:
                    return
                items, positions = self._draw(state, iterators, k)
                if not items or (self.batch_size is not None and len(items) < self.batch_size):
                    state.active[k] = False
                    if self.stop == "first":  # the mixture ends: a resumed one must not go on
                        state.active = [False] * len(state.active)
                        if items and self.partial:
                            yield self._finish(run, state, k, items, positions)
                        return
                    if not items or not self.partial:
                        continue
                yield self._finish(run, state, k, items, positions)
        finally:
            for iterator in iterators:
                if isinstance(iterator, Iterator) and hasattr(iterator, "close"):
                    iterator.close()

    def _draw(self, state: MixState, iterators: list[Iterator | None], k: int) -> tuple[list, list]:
        """One output's worth of items from source ``k``: one item, or up to a batch."""
        wanted = 1 if self.batch_size is None else self.batch_size
        items: list[Any] = []
        positions: list[Any] = []
        while len(items) < wanted:
            found, item = self._pull(state, iterators, k)
            if not found:
                break
            items.append(item)
            positions.append(self._position(state, k))
        return items, positions

    def _finish(self, run: Run, state: MixState, k: int, items: list, positions: list) -> Any:
        """Count an output of source ``k`` and say where it came from."""
        state.delivered[k] += 1
        if self.order == "round_robin":
            state.turn += 1
        if self.batch_size is None:
            run.position = positions[0]
            return items[0]
        run.position = positions
        return items if self.collation_fn is None else self.collation_fn(items)

    # --- restoring buffers and re-dealing ---------------------------------------------
    def read_positions(self, positions: Sequence[Position]) -> list[Any]:
        """Items at ``positions`` as their source pipeline delivered them."""
        return [self._read_one(position) for position in positions]

    def _read_one(self, position: Position) -> Any:
        owners = [k for k in range(len(self.sources)) if position.url in self._urls_of(k)]
        if len(owners) != 1:
            raise StateError(
                f"{position.url} is read by {len(owners)} sources of the mixture; a buffer after the "
                "mixer can only be restored when each shard belongs to one source"
            )
        # which epoch of its source the item was read in is not kept: no epoch seed (see EPOCH_SEED)
        return reread(self.sources[owners[0]].pipeline, [position], None)[0]

    def redealt(self, saved: JsonDict | None, table: PositionTable) -> bool:
        """Whether a saved state of the mixer holds sources' shares re-dealt by an elastic resume."""
        if saved is None:
            return False
        mix = MixState.from_json(saved, table)
        return any(
            state is not None and source.redealt(source.parse_state(state))
            for source, state in zip(self.sources, mix.sources)
        )

    def redeal_states(
        self,
        states: Sequence[PipelineState],
        leftovers: Sequence[Position],
        stages: Sequence[Stage],
        index: int,
        readers: RedealTarget,
    ) -> list[PipelineState]:
        """Each source's unread rest dealt to the new readers on its own; samples held by
        stages after the mixer go back to the source whose shard they came from, and what those
        stages hand every new reader (a packer's counts of tokens already emitted) goes with
        them, as for a single source."""
        key = stage_keys(stages)[index]
        held = list(leftovers)
        mixes = []
        for state in states:
            saved = state.stages.get(key)
            mix = MixState.from_json(saved, state.table()) if saved is not None else None
            mixes.append(mix)
            held.extend(redeal.held_positions(state, stages, skip=index))
        drawn = max((mix.base for mix in mixes if mix is not None), default=0)
        drawn += sum(mix.draws for mix in mixes if mix is not None)
        dealt = []
        for k, source in enumerate(self.sources):
            urls = set(self._urls_of(k))
            source_states = [self._source_state(state, mix, k, source) for state, mix in zip(states, mixes)]
            mine = [position for position in held if position.url in urls]
            dealt.append(redeal.redeal(source_states, mine, source.pipeline, readers))
        first = states[0]
        totals = [sum(column) for column in zip(*(mix.delivered for mix in mixes if mix is not None))]
        fresh = []
        for reader in range(readers.readers):
            mix = MixState()
            mix.reset(len(self.sources), first.epoch)
            mix.base = drawn
            mix.sources = [dealt[k][reader].to_json() for k in range(len(self.sources))]
            # each source goes on in the epoch its rest belongs to (under stop="never" a source
            # may be epochs ahead of the mixture), and the outputs already given stay counted
            mix.epochs = [dealt[k][reader].epoch for k in range(len(self.sources))]
            if reader == 0 and totals:
                mix.delivered = totals
            table = PositionTable()
            carried = redeal.carried_states(states, stages, table, skip=index)
            fresh.append(
                PipelineState(
                    first.fingerprint,
                    first.seed,
                    reader,
                    readers.readers,
                    first.epoch,
                    {key: mix.to_json(table), **carried},
                    table.urls,
                    passes=first.passes,
                )
            )
        return fresh

    @staticmethod
    def _source_state(
        state: PipelineState, mix: MixState | None, k: int, source: DataPipeline
    ) -> PipelineState:
        """Source ``k``'s state in an old reader: as saved, finished once the mixer found it
        exhausted (or the reader's whole share was: a mix that is itself a source of another
        mix), or its epoch's start when it had not begun."""
        epoch = mix.epochs[k] if mix is not None else state.epoch
        blank = PipelineState(source.fingerprint(), source.seed, state.consumer, state.consumers, epoch)
        if state.finished:
            blank.finished = True
            return blank
        if mix is None:
            return blank
        if not mix.active[k]:
            blank.finished = True
            return blank
        saved = mix.sources[k]
        return source.parse_state(saved) if saved is not None else blank

    def contributions(self, saved: JsonDict | None) -> list[int]:
        """Outputs each source has contributed, from a saved state of this stage."""
        if saved is None:
            return [0] * len(self.sources)
        return MixState.from_json(saved, PositionTable()).delivered


_END = object()


def _as_pipeline(source: Any) -> DataPipeline:
    """A source as a pipeline: wdsx pipelines as they are, any other iterable wrapped (it
    mixes, but cannot be checkpointed)."""
    return source if isinstance(source, DataPipeline) else DataPipeline(source)


class Mix(DataPipeline):
    """Several pipelines mixed into one, with the fluent methods and exact state.

    Args:
        sources: the pipelines to mix (``WebDataset(...)...``); other iterables mix too, but
            a checkpoint then cannot be taken.
        weights: relative weights of the sources (default: equal), or a schedule: a function
            of the draws made so far in the epoch giving the weights
            (:class:`~wdsx.pipeline.schedules.PiecewiseConstant`,
            :class:`~wdsx.pipeline.schedules.PiecewiseLinear`, any pure callable); under
            round-robin order they are ignored.
        stop: ``"first"``, ``"all"`` or ``"never"`` (see the module documentation).
        order: ``"random"`` (weighted draws) or ``"round_robin"``.
        batch_size: draw whole batches of this size from one source at a time.
        collation_fn: how such a batch is collated (None: a list).
        partial: whether a source's last, short batch is yielded.
        seed: the seed of the draws (default: ``WDS_SEED`` or 0).
    """

    def __init__(
        self,
        sources: Iterable[Any],
        weights: WeightsOrSchedule = None,
        *,
        stop: str = "all",
        order: str = "random",
        batch_size: int | None = None,
        collation_fn: Callable | None = default_collation_fn,
        partial: bool = True,
        seed: int | None = None,
    ):
        pipelines = [_as_pipeline(source) for source in sources]
        mixer = MixSource(pipelines, weights, stop, order, batch_size, collation_fn, partial)
        super().__init__(mixer, seed=seed)
        self.mixer = mixer

    def checked_state(
        self, state: Any, strict: bool = True, topology: Topology | None = None
    ) -> PipelineState:
        """The mixture's own state checked as any pipeline's, then each source's saved state
        checked by that source pipeline, as the same reader (a source's state is found bad
        now, not when the source starts; with ``strict=False`` a mismatched one is replaced
        by what the source makes of it)."""
        parsed = super().checked_state(state, strict, topology)
        saved = parsed.stages.get(MixSource.state_key)
        if saved is None:
            return parsed
        sources = self.mixer.sources
        key = MixSource.state_key
        if len(saved["sources"]) != len(sources):
            raise validate.InvalidState(
                ["stages", key, "sources"], f"a list of {len(sources)} items", saved["sources"]
            )
        where = topology or current_topology(self._captured)
        states = list(saved["sources"])
        for k, (source, source_state) in enumerate(zip(sources, states)):
            if source_state is not None:
                with validate.within("stages", key, "sources", k):
                    states[k] = source.checked_state(source_state, strict, where).to_json()
        parsed.stages[key] = {**saved, "sources": states}
        return parsed

    def skip_keys(self, keys: Iterable[str]) -> Mix:
        """Never deliver the samples with these keys: each source drops them as it reads."""
        super().skip_keys(keys)
        for source in self.mixer.sources:
            source.skip_keys(self.skipped_keys)
        return self

    def shard_identities(self) -> list[tuple[str, Identity]]:
        """Every source's shards with their identities."""
        return [shard for source in self.mixer.sources for shard in source.shard_identities()]

    def prepare(self, topology: Topology, endless: bool) -> None:
        for source in self.mixer.sources:
            source.prepare(topology, endless or self.mixer.stop == "never")

    def contributions(self) -> list[int]:
        """Outputs each source has contributed in this process's current epoch so far (once
        an epoch has ended, and until the next one starts, in that epoch)."""
        state = self.epoch_progress_state()
        return self.mixer.contributions(state.stages.get(MixSource.state_key))

    def contributions_in(self, state: JsonDict | None) -> list[int]:
        """Outputs each source has contributed according to a saved state of this mixture."""
        if state is None:
            return [0] * len(self.mixer.sources)
        return self.mixer.contributions(self.parse_state(state).stages.get(MixSource.state_key))


class RandomMix(Mix):
    """webdataset's ``RandomMix``: draws from ``datasets`` with probabilities ``probs``; stops
    at the first exhausted source unless ``longest``. Unlike webdataset's, it is seeded (the
    same draws on every run) and exactly resumable when its inputs are wdsx pipelines."""

    def __init__(self, datasets: Iterable[Any], probs: Sequence[float] | None = None, longest: bool = False):
        super().__init__(datasets, probs, stop="all" if longest else "first")


class RoundRobin(Mix):
    """webdataset's ``RoundRobin``: one item from each dataset in turn; stops at the first
    exhausted one unless ``longest``, which goes on with the others."""

    def __init__(self, datasets: Iterable[Any], longest: bool = False):
        super().__init__(datasets, stop="all" if longest else "first", order="round_robin")
