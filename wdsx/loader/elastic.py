"""Re-dealing a checkpoint to a different number of readers (ranks x workers).

Every old reader's state says which of its spans it has not read yet and which samples sit in
its buffers (read, never delivered). Pooling those over all readers gives exactly the samples
of the epoch not yet consumed; :func:`wdsx.read.deal.reshape` deals them to the new readers, whose
states then carry an explicit plan. Nothing is lost and nothing is read twice (except samples
the remainder policy marks as padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wdsx.core.errors import StateError
from wdsx.read import deal as planning
from wdsx.stages.base import Stage
from wdsx.stages.reading import ShardReader, batch_hint
from wdsx.state.checkpoint import FORMAT, VERSION, PositionTable


def _reader_index(stages: Sequence[Stage]) -> int:
    for index, stage in enumerate(stages):
        if isinstance(stage, ShardReader):
            return index
    raise StateError(
        "elastic resume needs a WebDataset (a pipeline whose first stage is wdsx's shard reader)"
    )


def buffered_positions(
    state: dict, reader: ShardReader, skip: int | None = None
) -> list[tuple[list[int], bool]]:
    """Samples held in the buffers of a pipeline state, as ``([shard, offset, ordinal], pad)``."""
    table = PositionTable(state.get("urls", []))
    shard_of = {url: i for i, url in enumerate(reader.urls)}
    leftovers = []
    for index, stage_state in state.get("stages", {}).items():
        if skip is not None and int(index) == skip:
            continue
        if isinstance(stage_state, dict) and "positions" in stage_state:
            for position in table.decode(stage_state["positions"]):
                if position[0] not in shard_of:
                    raise StateError(
                        f"checkpoint holds a sample of {position[0]}, which is not in the shard list"
                    )
                pad = len(position) > 3 and bool(position[3])
                leftovers.append(([shard_of[position[0]], position[1], position[2]], pad))
    return leftovers


def unread(state: dict, stages: Sequence[Stage], world_size: int) -> tuple[list[planning.Span], list]:
    """The spans and single samples one reader's state has not delivered yet."""
    index = _reader_index(stages)
    reader: ShardReader = stages[index]
    if reader.custom_split is not None:
        raise StateError("elastic resume is not possible with custom nodesplitter/workersplitter functions")
    if state.get("finished"):
        return [], []
    progress = state["stages"].get(str(index))
    consumer, consumers = state["topology"]
    if progress is not None and "plan" in progress:
        plan = planning.ConsumerPlan.from_json(progress["plan"])
    else:
        if progress is not None:
            reader.check_counts(progress.get("counts"))
        order = planning.epoch_order(len(reader.urls), state["seed"], state["epoch"], reader.shuffle)
        plan = reader.plan_consumer(order, consumer, consumers, batch_hint(stages, index), world_size)
    leftovers = buffered_positions(state, reader, skip=index)
    if progress is None:
        return list(plan.spans), list(plan.leftovers) + leftovers
    if progress["done"]:
        return [], leftovers
    leftovers = list(plan.leftovers[progress["leftover"] :]) + leftovers
    pos, ordinal, offset = progress["pos"], progress["ordinal"], progress["offset"]
    if progress["piece_done"]:
        pos, ordinal, offset = pos + 1, 0, 0
    return planning.remaining(plan, progress["span"], pos, ordinal, offset), leftovers


def redeal(
    states: Sequence[dict],
    extra_leftovers: Sequence[tuple[list[int], bool]],
    stages: Sequence[Stage],
    old_world_size: int,
    new_consumers: int,
    new_world_size: int,
) -> list[dict]:
    """Pipeline states for ``new_consumers`` readers that together deliver exactly what the
    old readers' ``states`` (plus ``extra_leftovers`` from loader-level buffers) had not."""
    if not states:
        raise StateError("no reader states to re-deal")
    epochs = {state["epoch"] for state in states}
    if len(epochs) != 1:
        raise StateError(f"readers are in different epochs {sorted(epochs)}; resume with the same topology")
    index = _reader_index(stages)
    reader: ShardReader = stages[index]
    spans: list[planning.Span] = []
    leftovers = list(extra_leftovers)
    for state in states:
        state_spans, state_leftovers = unread(state, stages, old_world_size)
        spans.extend(state_spans)
        leftovers.extend(state_leftovers)
    first = states[0]
    order = planning.epoch_order(len(reader.urls), first["seed"], first["epoch"], reader.shuffle)
    batch, partial = batch_hint(stages, index)
    counts = reader.counts_in_order(order)
    remainder = reader.remainder_for(new_world_size)
    plans = planning.reshape(spans, leftovers, new_consumers, counts, batch, partial, remainder)
    return [_fresh_state(first, index, consumer, new_consumers, plan) for consumer, plan in enumerate(plans)]


def _fresh_state(
    template: dict, index: int, consumer: int, consumers: int, plan: planning.ConsumerPlan
) -> dict:
    first = plan.spans[0] if plan.spans else planning.Span(0, 0, 0)
    progress: dict[str, Any] = {
        "span": 0,
        "pos": first.start,
        "offset": first.offset,
        "ordinal": first.start_ordinal,
        "piece_done": False,
        "leftover": 0,
        "draws": 0,
        "taken": 0,
        "done": False,
        "plan": plan.to_json(),
    }
    return {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": template["fingerprint"],
        "seed": template["seed"],
        "topology": [consumer, consumers],
        "epoch": template["epoch"],
        "stages": {str(index): progress},
        "nominal": 0,
        "urls": [],
    }
