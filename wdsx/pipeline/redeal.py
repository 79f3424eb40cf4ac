"""Re-dealing a checkpoint to a different number of readers (ranks x workers).

Every old reader's state says which part of its share it has not read yet and which samples
sit in its buffers (read, never delivered). Pooling those over all readers gives exactly the
samples of the epoch not yet consumed; the pipeline's :class:`~wdsx.read.deal.EpochDeal` deals
them to the new readers, whose states then carry an explicit plan. Nothing is lost and nothing
is read twice (except samples the remainder policy marks as padding). A source stage that
reads several pipelines (a mixture) re-deals each of them this way
(:meth:`~wdsx.stages.base.Stage.redeal_states`).

This module works with typed values only: the reader's progress
(:class:`~wdsx.read.progress.ReaderProgress`), the deal, and what each stage says it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from wdsx.core.errors import StateError
from wdsx.read.deal import EpochDeal, Span
from wdsx.read.progress import ReaderProgress
from wdsx.stages.base import RedealTarget, Stage, source_index, stage_keys
from wdsx.state.checkpoint import JsonDict, PipelineState
from wdsx.state.position import Position, PositionTable


def source_of(stages: Sequence[Stage]) -> tuple[int, Stage]:
    """The stage that reads the pipeline's samples, and its index."""
    index = source_index(stages)
    if index is None:
        raise StateError("elastic resume needs a pipeline that reads shards (a WebDataset or a mixture)")
    return index, stages[index]


def deal_of(stages: Sequence[Stage]) -> tuple[int, EpochDeal]:
    """The index of the stage that deals epochs from a fixed shard list, and its deal."""
    index, stage = source_of(stages)
    deal = stage.epoch_deal(stages, index)
    if deal is None:
        raise StateError(
            "elastic resume needs a WebDataset (a pipeline whose first stage is wdsx's shard reader)"
        )
    return index, deal


def held_positions(state: PipelineState, stages: Sequence[Stage], skip: int | None = None) -> list[Position]:
    """Samples held in the buffers of the stages of ``state`` (but stage ``skip``), each
    checked to come from the shards the pipeline reads."""
    table = state.table()
    held = []
    for index, (stage, key) in enumerate(zip(stages, stage_keys(stages))):
        if index != skip:
            held.extend(stage.held_positions(state.stages.get(key), table))
    known = set(source_of(stages)[1].shard_urls() or ())
    for position in held:
        if position.url not in known:
            raise StateError(f"checkpoint holds a sample of {position.url}, which is not in the shard list")
    return held


def unread(
    state: PipelineState, stages: Sequence[Stage], world_size: int
) -> tuple[list[Span], list[Position]]:
    """The spans and single samples one reader's state has not delivered yet."""
    if state.finished:
        return [], []
    index, deal = deal_of(stages)
    saved = state.stages.get(stage_keys(stages)[index])
    progress = ReaderProgress.from_json(saved, state.table()) if saved is not None else None
    if progress is not None and progress.plan is not None:
        plan = progress.plan
    else:
        if progress is not None:
            deal.check_counts(progress.counts)
            deal = replace(deal, round_robin=progress.round_robin)
        plan = deal.plan(state.seed, state.epoch, state.consumer, state.consumers, world_size)
    held = held_positions(state, stages, skip=index)
    if progress is None:
        return list(plan.spans), list(plan.leftovers) + held
    spans, leftovers = progress.unread(plan)
    return spans, leftovers + held


def redeal(
    states: Sequence[PipelineState],
    extra_leftovers: Sequence[Position],
    stages: Sequence[Stage],
    target: RedealTarget,
) -> list[PipelineState]:
    """Pipeline states for ``target.readers`` readers that together deliver exactly what the
    old readers' ``states`` (plus ``extra_leftovers`` from loader-level buffers) had not."""
    if not states:
        raise StateError("no reader states to re-deal")
    epochs = {state.epoch for state in states}
    if len(epochs) != 1:
        raise StateError(f"readers are in different epochs {sorted(epochs)}; resume with the same topology")
    index, stage = source_of(stages)
    custom = stage.redeal_states(states, extra_leftovers, stages, index, target)
    if custom is not None:
        return custom
    index, deal = deal_of(stages)
    spans: list[Span] = []
    leftovers = list(extra_leftovers)
    for state in states:
        state_spans, state_leftovers = unread(state, stages, target.old_world_size)
        spans.extend(state_spans)
        leftovers.extend(state_leftovers)
    first = states[0]
    plans = deal.redeal(first.seed, first.epoch, spans, leftovers, target.readers, target.world_size)
    key = stage_keys(stages)[index]
    fresh = []
    for reader, plan in enumerate(plans):
        table = PositionTable()
        progress = ReaderProgress.starting(plan).to_json(table)
        carried = carried_states(states, stages, table, skip=index)
        fresh.append(
            PipelineState(
                first.fingerprint,
                first.seed,
                reader,
                target.readers,
                first.epoch,
                {key: progress, **carried},
                table.urls,
                passes=first.passes,
            )
        )
    return fresh


def carried_states(
    states: Sequence[PipelineState], stages: Sequence[Stage], table: PositionTable, skip: int
) -> dict[str, JsonDict]:
    """What the stages but stage ``skip`` (the reader) hand every new reader of a re-deal, by
    stage key (:meth:`~wdsx.stages.base.Stage.carried_state`), positions written against
    ``table``."""
    carried = {}
    for index, (stage, key) in enumerate(zip(stages, stage_keys(stages))):
        if index != skip:
            saved = [(state.stages.get(key), state.table()) for state in states]
            state = stage.carried_state(saved, table)
            if state is not None:
                carried[key] = state
    return carried
