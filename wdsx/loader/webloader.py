"""WebLoader: a torch DataLoader over a wdsx pipeline, with fluent stages and exact state.

Each DataLoader worker runs its own copy of the dataset as one reader (consumer) of the epoch.
With every batch, the worker sends back its pipeline state as it was right after producing
that batch; the loader keeps, per worker, the state of the last batch it *yielded*, and which
worker's batch comes next. PyTorch hands out an IterableDataset's batches round-robin over
the workers (skipping finished ones), so on resume new worker ``j`` gets the state of old
worker ``(next + j) % W`` and the sequence of batches continues exactly.

A state saved with a different number of workers (or, through :func:`gather_loader_state`,
ranks) is re-dealt (:mod:`wdsx.loader.elastic`): the remaining samples of the epoch are read exactly
once by the new readers.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from wdsx.core import topology as distributed
from wdsx.core.errors import StateError
from wdsx.loader import elastic, transport
from wdsx.pipeline.datapipeline import DataPipeline, register_with_torch
from wdsx.stages.base import Run, Stage, replay, source_index
from wdsx.state.checkpoint import FORMAT, VERSION

log = logging.getLogger("wdsx")

GLOBAL_FORMAT = "wdsx-global-state"


class _WorkerStream:
    """The dataset DataLoader workers iterate: sets up each worker's identity and starting
    state, then yields ``(item, position, self)``, so that the collate function, which runs
    in the same process, can ask this stream for the state after the batch."""

    def __init__(
        self,
        dataset: DataPipeline,
        epoch: int,
        world: tuple[int, int],
        workers: int,
        consumers: list[int],
        starts: list[dict | None],
    ):
        self.dataset = dataset
        self.epoch = epoch
        self.world = world
        self.workers = workers
        self.consumers = consumers
        self.starts = starts
        self.slot = 0
        self.resumable = False
        self.finished = False

    def __iter__(self) -> Iterator[tuple[Any, Any, _WorkerStream]]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        self.slot = info.id if info is not None else 0
        rank, world = self.world
        consumer = self.consumers[self.slot]
        if info is not None:
            distributed.assign(distributed.Topology(rank, world, consumer % self.workers, self.workers))
        # A copy, so that making a with_epoch() dataset endless here (the loader counts the
        # nominal epoch instead) leaves the caller's object alone when there are no workers.
        dataset = self.dataset = copy.copy(self.dataset)
        dataset.nsamples = -1
        self.resumable = not dataset.not_resumable()
        start = self.starts[self.slot]
        self.finished = bool(start and start.get("finished"))
        if self.finished:
            return
        if start is not None:
            dataset.load_state_dict(start)
        else:
            dataset.set_epoch(self.epoch)
        for item in dataset:
            yield item, dataset.current_position() if self.resumable else None, self
        self.finished = True

    def state(self) -> dict | None:
        """The pipeline's state now, if it can be restored exactly. Once this worker's share of
        the epoch is exhausted the state says so, so that a worker resumed from it delivers
        nothing more in this epoch (the batch in hand may be a short last one)."""
        if not self.resumable:
            return None
        state = self.dataset.snapshot()
        if self.finished:
            state["finished"] = True
        return state


class _CollateWithState:
    """Runs where the items are produced: collates as the DataLoader would, and attaches the
    worker's slot, its pipeline state after this batch, and the batch's sample positions."""

    def __init__(self, collate: Callable, auto_batched: bool):
        self.collate = collate
        self.auto_batched = auto_batched

    def __call__(self, batch: Any) -> tuple:
        if self.auto_batched:
            output = self.collate([item for item, _, _ in batch])
            positions = [position for _, position, _ in batch]
            stream = batch[-1][2]
        else:
            item, positions, stream = batch
            output = self.collate(item)
        return output, stream.slot, stream.state(), positions


class _LoaderProgress:
    """The loader's view of its workers: the state of each worker slot after its last
    delivered batch, which reader each slot is, and whose batch comes next."""

    def __init__(self, workers: int, rank: int, world: int):
        self.workers = workers
        self.rank = rank
        self.world = world
        self.consumers = [rank * workers + slot for slot in range(workers)]
        self.states: list[dict | None] = [None] * workers
        self.next = 0
        self.complete = False

    def received(self, slot: int, state: dict | None) -> None:
        self.states[slot] = state
        self.next = (slot + 1) % self.workers

    def snapshot(self, table: Any) -> dict:
        return {
            "workers": self.workers,
            "rank": self.rank,
            "world": self.world,
            "consumers": list(self.consumers),
            "states": list(self.states),
            "next": self.next,
            "complete": self.complete,
        }

    def restore(self, saved: dict) -> None:
        """Rotate so that slot 0 is the worker whose batch was due next."""
        shift = saved["next"]
        count = saved["workers"]
        self.consumers = [saved["consumers"][(shift + j) % count] for j in range(count)]
        self.states = [saved["states"][(shift + j) % count] for j in range(count)]
        self.complete = saved["complete"]


class LoaderSource(Stage):
    """The first stage of a WebLoader: one DataLoader pass per epoch."""

    produces_samples = True

    def __init__(self, loader: WebLoader):
        self.loader = loader

    def describe(self) -> str:
        return f"loader({self.loader.dataset_description()})"

    def not_resumable(self) -> str | None:
        dataset = self.loader.dataset
        if not isinstance(dataset, DataPipeline):
            return f"the dataset is a {type(dataset).__name__}, not a wdsx pipeline"
        reasons = dataset.not_resumable()
        return "; ".join(reasons) if reasons else None

    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        loader = self.loader
        progress = _LoaderProgress(loader.slots, run.topology.rank, run.topology.world_size)
        saved = run.register(index, progress)
        if saved is not None:
            progress.restore(saved)
        return self._batches(run, progress)

    def _batches(self, run: Run, progress: _LoaderProgress) -> Iterator:
        if progress.complete:
            return
        loader = self.loader
        if not isinstance(loader.dataset, DataPipeline):
            yield from loader.make_dataloader(loader.dataset, plain=True)
            return
        stream = _WorkerStream(
            loader.dataset,
            run.epoch,
            (run.topology.rank, run.topology.world_size),
            progress.workers,
            progress.consumers,
            progress.states,
        )
        for output, slot, state, positions in loader.make_dataloader(stream):
            progress.received(slot, state)
            run.position = positions
            yield output
        progress.complete = True

    def read_positions(self, positions: list[tuple]) -> list[Any]:
        """Re-create single items as the DataLoader delivered them (for main-process buffers)."""
        stages = self.loader.dataset.pipeline
        index = source_index(stages)
        items = replay(stages[index].read_positions(positions), stages[index + 1 :])
        return [self.loader.collate_one(item) for item in items]


class WebLoader(DataPipeline):
    """``torch.utils.data.DataLoader(dataset, ...)`` with webdataset's fluent methods, exact
    ``state_dict()`` / ``load_state_dict()``, and rank-aware reading for multi-node jobs.

    Takes the DataLoader's arguments. Stages added with the fluent methods (``.unbatched()``,
    ``.shuffle(n)``, ``.batched(b)``...) run in the main process on what the workers deliver.

    Workers send batches through shared memory that they reuse once the main process has
    freed a batch (:mod:`wdsx.loader.transport`), instead of new shared memory for every tensor;
    ``reuse_shared_memory=False`` restores PyTorch's way.
    """

    def __init__(self, dataset: Any, *args: Any, reuse_shared_memory: bool = True, **kwargs: Any):
        from torch.utils.data import DataLoader

        bound = inspect.signature(DataLoader).bind(dataset, *args, **kwargs)
        self.dataset = dataset
        self.reuse_shared_memory = reuse_shared_memory
        self.loader_kwargs = {k: v for k, v in bound.arguments.items() if k != "dataset"}
        super().__init__(LoaderSource(self))
        register_with_torch()

    @property
    def slots(self) -> int:
        """Number of reading streams in this process: the DataLoader workers, or 1."""
        return max(1, self.loader_kwargs.get("num_workers", 0))

    @property
    def auto_batched(self) -> bool:
        return self.loader_kwargs.get("batch_size", 1) is not None

    def dataset_description(self) -> str:
        dataset = self.dataset
        if isinstance(dataset, DataPipeline):
            return ", ".join(stage.describe() for stage in dataset.pipeline)
        return type(dataset).__name__

    def collate_one(self, item: Any) -> Any:
        """What the DataLoader's collation makes of a single item."""
        from torch.utils.data import default_collate, default_convert

        collate = self.loader_kwargs.get("collate_fn")
        if self.auto_batched:
            return (collate or default_collate)([item])
        return (collate or default_convert)(item)

    def make_dataloader(self, dataset: Any, plain: bool = False) -> Any:
        from torch.utils.data import DataLoader, IterableDataset, default_collate, default_convert

        IterableDataset.register(_WorkerStream)
        kwargs = dict(self.loader_kwargs)
        collate = kwargs.get("collate_fn") or (default_collate if self.auto_batched else default_convert)
        if self.reuse_shared_memory:
            collate = transport.PackingCollate(collate)
        if not plain:
            collate = _CollateWithState(collate, self.auto_batched)
        kwargs["collate_fn"] = collate
        return DataLoader(dataset, **kwargs)

    def __iter__(self) -> Iterator:
        dataset = self.dataset
        if isinstance(dataset, DataPipeline) and dataset._pending is not None:
            raise StateError("a checkpoint was loaded into the dataset; load it into the WebLoader instead")
        if isinstance(dataset, DataPipeline) and dataset.nsamples > 0 and self.nsamples <= 0:
            # dataset.with_epoch(n): n items per worker per epoch. The workers stream without
            # end and the loader cuts its epochs at n x workers items, so each epoch continues
            # the streams where the last one stopped (checkpoints included).
            self.repetitions, self.nsamples = sys.maxsize, dataset.nsamples * self.slots
        if hasattr(dataset, "prepare"):
            topology = distributed.current(self._captured)
            dataset.prepare(topology, endless=self.nsamples > 0 or self.repetitions == sys.maxsize)
        return super().__iter__()

    # --- elastic resume ---------------------------------------------------------------
    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """Resume from a state saved by this loader, by a loader with a different number of
        workers, or (a :func:`gather_loader_state` result) by a job with different ranks."""
        topology = distributed.current(self._captured)
        rank, world = topology.rank, topology.world_size
        if state.get("format") == GLOBAL_FORMAT:
            ranks = state["ranks"]
            if len(ranks) == world and all(_workers_of(r) in (None, self.slots) for r in ranks):
                state = ranks[rank]
            else:
                state = self._redealt(ranks, rank, world)
        elif "0" in state.get("stages", {}) and (
            _workers_of(state) != self.slots or _world_of(state) != world
        ):
            if _world_of(state) != world:
                raise StateError(
                    f"this loader state was saved by rank {_loader_progress(state)['rank']} of "
                    f"{_world_of(state)}; to resume on {world} ranks, gather every rank's state with "
                    "gather_loader_state() and load that"
                )
            state = self._redealt([state], rank, world)
        super().load_state_dict(state, strict)

    def _redealt(self, rank_states: list[dict], rank: int, world: int) -> dict:
        """This rank's share of a checkpoint re-dealt to the current ranks x workers."""
        if not isinstance(self.dataset, DataPipeline):
            raise StateError("elastic resume needs a wdsx dataset")
        old_world = _world_of(rank_states[0])
        if hasattr(self.dataset, "prepare"):  # the old plans were made with the counts it finds
            self.dataset.prepare(distributed.Topology(0, old_world, 0, 1), self.dataset.nsamples > 0)
        readers: list[dict] = []
        main_leftovers: list = []
        for rank_state in rank_states:
            progress = _loader_progress(rank_state)
            for slot, reader_state in enumerate(progress["states"]):
                if reader_state is None:
                    reader_state = self._fresh_reader_state(rank_state, progress["consumers"][slot], progress)
                readers.append(reader_state)
            main_leftovers.extend(self._main_leftovers(rank_state))
        consumers = world * self.slots
        log.info(
            "re-dealing a checkpoint of %d readers to %d readers (%d ranks x %d)",
            len(readers),
            consumers,
            world,
            self.slots,
        )
        new_states = elastic.redeal(
            readers, main_leftovers, self.dataset.pipeline, old_world, consumers, world
        )
        progress = _LoaderProgress(self.slots, rank, world)
        progress.states = new_states[rank * self.slots : (rank + 1) * self.slots]
        return {
            **rank_states[0],
            "topology": [rank, world],
            "stages": {"0": progress.snapshot(None)},
            "urls": [],
            "nominal": 0,
        }

    def _fresh_reader_state(self, rank_state: dict, consumer: int, progress: dict) -> dict:
        """The state of a reader that had not delivered anything yet in this epoch."""
        return {
            "fingerprint": self.dataset.fingerprint(),
            "seed": self.dataset.seed,
            "topology": [consumer, progress["world"] * progress["workers"]],
            "epoch": rank_state["epoch"],
            "stages": {},
            "urls": [],
        }

    def _main_leftovers(self, rank_state: dict) -> list:
        """Samples held by this loader's main-process stages in a saved state."""
        reader = self.dataset.pipeline[source_index(self.dataset.pipeline)]
        return elastic.buffered_positions(rank_state, reader, skip=0)


def _loader_progress(state: dict) -> dict:
    return state["stages"]["0"]


def _workers_of(state: dict) -> int | None:
    progress = state.get("stages", {}).get("0")
    return None if progress is None else progress["workers"]


def _world_of(state: dict) -> int:
    return _loader_progress(state)["world"]


def gather_loader_state(loader: WebLoader, group: Any = None) -> dict:
    """All ranks' loader states in one JSON-serialisable checkpoint, returned on every rank.

    Call it on every rank at the same step (it is a ``torch.distributed`` collective). Save the
    result from rank 0; when resuming, load it on every rank with ``loader.load_state_dict``:
    the same topology takes its own part, a different one is re-dealt.
    """
    import torch.distributed as dist

    state = loader.state_dict()
    if not (dist.is_available() and dist.is_initialized()):
        return {"format": GLOBAL_FORMAT, "version": VERSION, "ranks": [state]}
    states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, state, group=group)
    return {"format": GLOBAL_FORMAT, "version": VERSION, "ranks": states}


def split_loader_state(global_state: dict, rank: int) -> dict:
    """One rank's part of a gathered checkpoint saved with the same topology."""
    if global_state.get("format") != GLOBAL_FORMAT:
        raise StateError(f"not a {GLOBAL_FORMAT} checkpoint")
    return global_state["ranks"][rank]


__all__ = ["WebLoader", "gather_loader_state", "split_loader_state", "FORMAT"]
