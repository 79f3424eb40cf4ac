"""WebLoader: a torch DataLoader over a wdsx pipeline, with fluent stages and exact state.

Each DataLoader worker runs its own copy of the dataset as one reader (consumer) of the epoch.
With every batch, the worker sends back its pipeline state as it was right after producing
that batch; the loader keeps, per worker, the state of the last batch it *yielded*, and which
worker's batch comes next. PyTorch hands out an IterableDataset's batches round-robin over
the workers (skipping finished ones), so on resume new worker ``j`` gets the state of old
worker ``(next + j) % W`` and the sequence of batches continues exactly.

A state saved with a different number of workers (or, through :func:`gather_loader_state`,
ranks) is re-dealt (:mod:`wdsx.pipeline.redeal`): the remaining samples of the epoch are read exactly
once by the new readers.

With ``worker_type="thread"`` the workers are reader threads of this process, the same readers
with the same states; :mod:`wdsx.loader.threads` delivers their batches in the same order.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wdsx.core import topology as distributed
from wdsx.core.errors import StateError
from wdsx.core.sampleseed import epoch_seed
from wdsx.loader import arena, lifeline, threads, transport
from wdsx.loader.profile import Clock, LoaderStats, LoaderWatch, WorkerSide
from wdsx.pipeline import redeal
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.mixing import Mix
from wdsx.stages.base import Count, RedealTarget, Run, Stage, reread, source_index
from wdsx.state import validate
from wdsx.state.checkpoint import FORMAT, VERSION, JsonDict, PipelineState
from wdsx.state.fingerprint import Identity
from wdsx.state.position import Position, PositionTable, as_json

log = logging.getLogger("wdsx")

GLOBAL_FORMAT = "wdsx-global-state"
"""Every rank's loader state in one checkpoint: ``{"format", "version", "ranks": [...]}``.
The rank states carry and are checked against their own versions."""


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
        starts: list[JsonDict | None],
        watch: LoaderWatch,
    ):
        self.dataset = dataset
        self.watch = watch
        self.side: WorkerSide | None = None
        self.epoch = epoch
        self.world = world
        self.workers = workers
        self.consumers = consumers
        self.starts = starts
        self.slot = 0
        self.resumable = False
        self.finished = False

    def __iter__(self) -> Iterator[tuple[Any, Any, _WorkerStream]]:
        """In a DataLoader worker process (or, with ``num_workers=0``, the main process)."""
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is None:
            return self.read(0, in_process=True)
        reader = self.reader(info.id)
        distributed.assign(reader)
        if reader.worker != info.id:
            _tell_torch(info, reader.worker)
        return self.read(info.id, in_process=False)

    def reader(self, slot: int) -> distributed.Topology:
        """Who the worker in ``slot`` reads as: its consumer's place among the epoch's readers."""
        rank, world = self.world
        return distributed.Topology(rank, world, self.consumers[slot] % self.workers, self.workers)

    def in_thread(self, slot: int) -> Iterator[tuple[Any, Any, _WorkerStream]]:
        """The stream of the worker in ``slot``, run by a reader thread: this stream and its
        dataset copied, as a worker process has its own, and the thread made that reader."""
        twin = copy.copy(self)
        twin.dataset = copy.deepcopy(self.dataset)
        with distributed.assigned_to_thread(self.reader(slot)):
            yield from twin.read(slot, in_process=False)

    def read(self, slot: int, in_process: bool) -> Iterator[tuple[Any, Any, _WorkerStream]]:
        """The items of the worker in ``slot`` from its starting state (``in_process``: the
        loader has no workers, and this is its own iteration in the main process)."""
        self.slot = slot
        # A copy, so that making a with_epoch() dataset endless here (the loader counts the
        # nominal epoch instead) leaves the caller's object alone when there are no workers.
        dataset = self.dataset = copy.copy(self.dataset)
        if dataset.continues_across_iters():
            dataset.nsamples = -1
        self.resumable = not dataset.not_resumable()
        start = self.starts[slot]
        self.finished = bool(start and start.get("finished"))
        if self.finished:
            if slot == 0:
                self.watch.worker(dataset, 0, in_process).close()
            return
        if start is not None:
            dataset.load_state_dict(start)
        else:
            dataset.set_epoch(self.epoch)
        dataset.decode_threads = self.watch.decode_threads
        dataset.defer_positions = True
        side = self.side = self.watch.worker(dataset, slot, in_process)
        try:
            for item in dataset:
                side.produced += 1
                yield item, dataset.current_position() if self.resumable else None, self
                side.out()
        finally:
            side.close()
        self.finished = True

    def state(self) -> JsonDict | None:
        """The pipeline's state now, if it can be restored exactly. Once this worker's share of
        the epoch is exhausted the state says so, so that a worker resumed from it delivers
        nothing more in this epoch (the batch in hand may be a short last one)."""
        if not self.resumable:
            return None
        state = self.dataset.current_state()
        state.finished = self.finished
        return state.to_json()


def _tell_torch(info: Any, worker: int) -> None:
    """Make torch's ``get_worker_info().id`` in this worker process say ``worker``, the reader
    it reads as. A resumed epoch can start in another worker than the first, so the loader
    gives processes the readers in turn from there; splitters written for webdataset ask
    torch which worker they are in, and must get the same answer as wdsx's own."""
    from torch.utils.data._utils import worker as torch_worker

    # the same fields, the id changed (a frozen dataclass in recent torch, a plain class before)
    extra = {name: getattr(info, name) for name in ("rng", "worker_method") if hasattr(info, name)}
    torch_worker._worker_info = type(info)(
        id=worker, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset, **extra
    )


class _CollateWithState:
    """Runs where the items are produced: collates as the DataLoader would, and attaches the
    worker's slot, its pipeline state after this batch, and the batch's sample positions."""

    def __init__(self, collate: Callable, auto_batched: bool):
        self.collate = collate
        self.auto_batched = auto_batched

    def __call__(self, batch: Any) -> tuple:
        began = time.perf_counter()
        packing = getattr(self.collate, "seconds", 0.0)
        if self.auto_batched:
            output = self.collate([item for item, _, _ in batch])
            positions = [position for _, position, _ in batch]
            stream = batch[-1][2]
        else:
            item, positions, stream = batch
            output = self.collate(item)
        packed = getattr(self.collate, "seconds", 0.0) - packing
        side = stream.side
        assert side is not None, "collating items of a stream that is iterating"
        report = side.report(time.perf_counter() - began - packed, packed)
        return output, stream.slot, stream.state(), positions, report


@dataclass
class LoaderProgress:
    """The loader's state: per worker slot, the worker's pipeline state (JSON, owned by the
    dataset, whose positions stay :class:`~wdsx.state.position.PackedPositions` tables until a
    checkpoint is read: ``state_dict`` packs them) after its last delivered batch; which reader
    each slot is; whose batch is next."""

    workers: int = 1
    rank: int = 0
    world: int = 1
    consumers: list[int] = field(default_factory=lambda: [0])
    states: list[JsonDict | None] = field(default_factory=lambda: [None])
    next: int = 0
    complete: bool = False

    @classmethod
    def fresh(cls, workers: int, rank: int, world: int) -> LoaderProgress:
        """The progress of a loader that has delivered nothing yet this epoch."""
        progress = cls()
        progress.reset(workers, rank, world)
        return progress

    def reset(self, workers: int, rank: int, world: int) -> None:
        """Start an epoch with ``workers`` slots on ``rank`` of ``world``."""
        self.workers, self.rank, self.world = workers, rank, world
        self.consumers = [rank * workers + slot for slot in range(workers)]
        self.states = [None] * workers
        self.next, self.complete = 0, False

    def received(self, slot: int, state: JsonDict | None) -> None:
        self.states[slot] = state
        self.next = (slot + 1) % self.workers

    def rotated(self) -> LoaderProgress:
        """The same progress with slot 0 the worker whose batch was due next (PyTorch starts
        each epoch at worker 0)."""
        shift, count = self.next, self.workers
        return LoaderProgress(
            count,
            self.rank,
            self.world,
            [self.consumers[(shift + j) % count] for j in range(count)],
            [self.states[(shift + j) % count] for j in range(count)],
            0,
            self.complete,
        )

    def to_json(self, table: PositionTable) -> JsonDict:
        return {
            "workers": self.workers,
            "rank": self.rank,
            "world": self.world,
            "consumers": list(self.consumers),
            "states": list(self.states),
            "next": self.next,
            "complete": self.complete,
        }

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> LoaderProgress:
        """The saved progress, rotated (an equivalent form) so that slot 0 is due next. The
        topology must be consistent (each slot one distinct reader of ``world x workers``);
        the workers' states are objects or null (the loader checks them against its dataset)."""
        data = validate.mapping(data)
        workers = validate.integer(data, "workers", low=1)
        world = validate.integer(data, "world", low=1)
        rank = validate.integer(data, "rank", high=world - 1)
        consumers = validate.integers(data, "consumers", length=workers)
        mine = [rank * workers + slot for slot in range(workers)]
        if consumers != mine[consumers[0] - mine[0] :] + mine[: consumers[0] - mine[0]]:
            raise validate.invalid("consumers", f"the readers of rank {rank} in turn, as {mine}", consumers)
        states = validate.listing(data, "states", length=workers)
        for slot, state in enumerate(states):
            if state is not None and not isinstance(state, dict):
                raise validate.InvalidState(["states", slot], "a worker's state (an object) or null", state)
        return cls(
            workers,
            rank,
            world,
            list(consumers),
            list(states),
            validate.integer(data, "next", high=workers - 1),
            validate.boolean(data, "complete"),
        ).rotated()

    def held(self) -> list[Position]:
        """The main process holds no samples between batches; workers' buffers are in
        their own states."""
        return []


WORKER_TYPES = ("process", "thread")


class LoaderFactory:
    """What a WebLoader makes its batches with: the dataset, the DataLoader's arguments, and
    whether its workers are processes (a DataLoader) or threads (:mod:`wdsx.loader.threads`)."""

    def __init__(
        self,
        dataset: Any,
        loader_kwargs: dict[str, Any],
        reuse_shared_memory: bool,
        watch: LoaderWatch,
        worker_type: str = "process",
    ):
        if worker_type not in WORKER_TYPES:
            raise ValueError(f"worker_type must be one of {WORKER_TYPES}, not {worker_type!r}")
        self.dataset = dataset
        self.loader_kwargs = loader_kwargs
        self.reuse_shared_memory = reuse_shared_memory
        self.watch = watch
        self.worker_type = worker_type

    @property
    def slots(self) -> int:
        """Number of reading streams in this process: the workers, or 1."""
        return max(1, self.loader_kwargs.get("num_workers", 0))

    @property
    def threaded(self) -> bool:
        """True when the workers are reader threads of this process."""
        return self.worker_type == "thread" and self.loader_kwargs.get("num_workers", 0) > 0

    @property
    def auto_batched(self) -> bool:
        return self.loader_kwargs.get("batch_size", 1) is not None

    def describe(self) -> str:
        dataset = self.dataset
        if isinstance(dataset, DataPipeline):
            return ", ".join(stage.describe() for stage in dataset.pipeline)
        return type(dataset).__name__

    def check_arguments(self) -> None:
        """Raise what a DataLoader would for these arguments: thread workers make none, so one
        without workers checks them (the arguments only workers take left out)."""
        from torch.utils.data import DataLoader

        workers_only = ("num_workers", "prefetch_factor", "persistent_workers", "multiprocessing_context")
        DataLoader(self.dataset, **{k: v for k, v in self.loader_kwargs.items() if k not in workers_only})

    def user_collate(self) -> Callable:
        """The DataLoader's collate function: the one given, or torch's default."""
        from torch.utils.data import default_collate, default_convert

        given = self.loader_kwargs.get("collate_fn")
        return given or (default_collate if self.auto_batched else default_convert)

    def collate_one(self, item: Any) -> Any:
        """What the DataLoader's collation makes of a single item."""
        return self.user_collate()([item] if self.auto_batched else item)

    def make(self, dataset: Any, plain: bool = False, session: str | None = None) -> Any:
        """A DataLoader over ``dataset``; unless ``plain``, its batches carry worker states.
        ``session``: names the pass, whose shared-memory segments stay mapped in this process
        until :func:`transport.close_session`. Its workers never outlive this process."""
        from torch.utils.data import DataLoader, IterableDataset

        IterableDataset.register(_WorkerStream)
        kwargs = dict(self.loader_kwargs)
        collate = self.user_collate()
        init = kwargs.get("worker_init_fn")
        if self.reuse_shared_memory:
            collate = transport.PackingCollate(collate, arena.worker_memory, session)
            init = arena.InitWorker(init)
        kwargs["worker_init_fn"] = lifeline.TiedWorker(init)
        if not plain:
            collate = _CollateWithState(collate, self.auto_batched)
        kwargs["collate_fn"] = collate
        if kwargs.get("num_workers", 0) > 0:
            _import_what_workers_import()
        return DataLoader(dataset, **kwargs)


class LoaderSource(Stage):
    """The first stage of a WebLoader: one DataLoader pass per epoch."""

    produces_samples = True
    state_key = "loader"
    state_type = LoaderProgress

    def __init__(self, factory: LoaderFactory):
        self.factory = factory
        self.reread_seed: int | None = None
        """The epoch seed the workers stamp on samples this epoch, for samples re-read into
        main-process buffers; None when a worker's stream spans several epochs of the data."""

    def describe(self) -> str:
        return f"loader({self.factory.describe()})"

    def __repr__(self) -> str:
        """The dataset and the DataLoader arguments given (``WebDataset(...) | batched(16),
        batch_size=None, num_workers=4``), and the worker type unless processes."""
        arguments = dict(self.factory.loader_kwargs)
        if self.factory.worker_type != "process":
            arguments["worker_type"] = self.factory.worker_type
        given = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        return f"{self.factory.dataset!r}, {given}" if given else repr(self.factory.dataset)

    def not_resumable(self) -> str | None:
        dataset = self.factory.dataset
        if not isinstance(dataset, DataPipeline):
            return f"the dataset is a {type(dataset).__name__}, not a wdsx pipeline"
        reasons = dataset.not_resumable()
        return "; ".join(f"the dataset's {reason}" for reason in reasons) if reasons else None

    def source_count(self, stages: Sequence[Stage], index: int, run: Run) -> Count | None:
        """The DataLoader's batches this rank receives in the epoch: each worker's share of
        the dataset, batched by the DataLoader when it batches."""
        factory = self.factory
        dataset = factory.dataset
        if not isinstance(dataset, DataPipeline):
            return None
        topology = run.topology
        dataset.prepare(distributed.Topology(topology.rank, topology.world_size, 0, 1), dataset.nsamples > 0)
        workers = factory.loader_kwargs.get("num_workers", 0)
        batch = factory.loader_kwargs.get("batch_size", 1)
        drop_last = factory.loader_kwargs.get("drop_last", False)
        items = samples = 0
        single = batch is None
        saved = run.restore.stages.get(self.state_key) if run.restore is not None else None
        # each worker's saved state: a re-dealt share is counted from its re-deal
        states = [None] * factory.slots if saved is None else saved["states"]
        for worker, state in enumerate(states):
            reader = distributed.Topology(topology.rank, topology.world_size, worker, max(1, workers))
            count = dataset.share_count(reader, run.epoch, state)
            whole, rest = divmod(count.items, batch) if batch is not None else (count.items, 0)
            items += whole + (1 if rest and not drop_last else 0)
            samples += count.samples
            single = single and count.single
        return Count(items, samples, single)

    def shard_urls(self) -> Sequence[str] | None:
        dataset = self.factory.dataset
        if not isinstance(dataset, DataPipeline):
            return None
        index = source_index(dataset.pipeline)
        return None if index is None else dataset.pipeline[index].shard_urls()

    def upgrade_state(self, saved: JsonDict, table: PositionTable) -> JsonDict:
        dataset = self.factory.dataset
        if not isinstance(dataset, DataPipeline):
            return saved
        states = [None if state is None else _upgrade_worker(dataset, state) for state in saved["states"]]
        return {**saved, "states": states}

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        progress, restored = run.attach(index, LoaderProgress)
        if not restored:
            progress.reset(self.factory.slots, run.topology.rank, run.topology.world_size)
        dataset = self.factory.dataset
        if isinstance(dataset, DataPipeline):
            one_epoch = dataset.nsamples <= 0 and dataset.repetitions == 1
            self.reread_seed = epoch_seed(dataset.seed, run.epoch) if one_epoch else None
        return self._batches(run, progress)

    def _batches(self, run: Run, progress: LoaderProgress) -> Iterator:
        if progress.complete:
            return
        session = os.urandom(8).hex()
        try:
            yield from self._session(run, progress, session)
        finally:
            transport.close_session(session)

    def _session(self, run: Run, progress: LoaderProgress, session: str) -> Iterator:
        factory = self.factory
        if not isinstance(factory.dataset, DataPipeline):
            yield from _running(factory.make(factory.dataset, plain=True, session=session))
            return
        stream = _WorkerStream(
            factory.dataset,
            run.epoch,
            (run.topology.rank, run.topology.world_size),
            progress.workers,
            progress.consumers,
            progress.states,
            factory.watch,
        )
        watch, stats = factory.watch, factory.watch.stats
        kwargs = factory.loader_kwargs
        if factory.threaded:
            watch.open(threads.CONTEXT, factory.slots)
            collate = _CollateWithState(factory.user_collate(), factory.auto_batched)
            batches = threads.worker_batches(stream.in_thread, factory.slots, kwargs, collate)
        else:
            watch.open(kwargs.get("multiprocessing_context"), kwargs.get("num_workers", 0))
            batches = _running(factory.make(stream, session=session))
        clock = Clock(stats)
        for output, slot, state, positions, report in batches:
            clock.received()
            stats.add(report)
            watch.collect()
            progress.received(slot, state)
            run.position = positions
            yield output
            clock.resumed()
        watch.collect()
        progress.complete = True

    def read_positions(self, positions: Sequence[Position]) -> list[Any]:
        """Re-create single items as the DataLoader delivered them (for main-process buffers)."""
        items = reread(self.factory.dataset.pipeline, positions, self.reread_seed)
        return [self.factory.collate_one(item) for item in items]


_RUNNING: dict[int, Any] = {}
"""The DataLoader iterators of epochs in progress. A pipeline dropped mid-epoch is freed by the
garbage collector, which runs the finalisers of the worker queues' helper threads before it
closes the pipeline's generators; the workers would then never hear that the epoch ended and
each would take torch's 5 s status interval to exit. Referenced from here, the iterator and its
queues stay intact until the generator that runs it shuts its workers down."""


def _import_what_workers_import() -> None:
    """Import in this process what every worker process imports as it starts, so that forked
    workers inherit it instead of importing it again, each of them, every epoch: torch's worker
    loop seeds numpy's global generator, which imports ``numpy.random`` (about 20 ms of CPU a
    worker where this process has not imported it)."""
    import numpy.random  # noqa: F401


def _running(dataloader: Any) -> Iterator:
    """The batches of ``dataloader``; its workers are shut down when this generator ends,
    however it ends, in the process that started them. A loop left with ``break`` can leave
    this generator in a reference cycle, collected later, possibly inside a worker forked for
    the next epoch (a copy of this process): there it has no workers to shut down."""
    batches = iter(dataloader)
    owner = os.getpid()
    _RUNNING[id(batches)] = batches
    try:
        yield from batches
    finally:
        if os.getpid() == owner:
            del _RUNNING[id(batches)]
            shut_down = getattr(batches, "_shutdown_workers", None)
            if shut_down is not None:
                shut_down()


def _upgrade_worker(dataset: DataPipeline, state: JsonDict) -> JsonDict:
    """A worker's version-2 pipeline state in today's form (its ``finished`` mark kept)."""
    return dataset.upgrade_state(state) if state.get("version", 0) < VERSION else state


class WebLoader(DataPipeline):
    """A ``torch.utils.data.DataLoader(dataset, ...)``, wrapped (as webdataset's is: not a
    subclass), with webdataset's fluent methods, exact ``state_dict()`` /
    ``load_state_dict()``, and rank-aware reading for multi-node jobs.

    Takes the DataLoader's arguments. Stages added with the fluent methods (``.unbatched()``,
    ``.shuffle(n)``, ``.batched(b)``...) run in the main process on what the workers deliver.

    Workers send batches through shared memory that they reuse once the main process has
    freed a batch (:mod:`wdsx.loader.transport`), instead of new shared memory for every tensor;
    ``reuse_shared_memory=False`` restores PyTorch's way. Workers end within a fraction of a
    second when the process that started them dies, however it dies
    (:mod:`wdsx.loader.lifeline`).

    ``loader.stats()`` says where the time goes (:mod:`wdsx.loader.profile`); ``profile=True``
    adds each stage's time in the workers. A worker that produces nothing for
    ``stall_timeout`` seconds is reported with the shard and byte offset its reader is at
    (:mod:`wdsx.loader.watchdog`); None turns the watchdog off. ``decode_threads``: threads
    per worker that decode each batch's images where they are decoded straight into the batch
    (both simplejpeg and Pillow release the GIL while decoding).

    ``worker_type="thread"``: the ``num_workers`` workers are threads of this process instead
    of processes (:mod:`wdsx.loader.threads`): each runs its own copy of the dataset as the
    same reader a worker process would be, so checkpoints are the same and load either way.
    Less memory and a quicker start; worth it where the heavy work releases the GIL (decoding
    images, numpy), not for Python-heavy per-sample maps. ``worker_init_fn(worker_id)`` runs
    in each thread, where torch's ``get_worker_info()`` is None (``wdsx.pytorch_worker_info()``
    tells the worker), so a ``WebDataset`` with a workersplitter function of its own is
    refused;
    ``multiprocessing_context``, ``persistent_workers`` and ``reuse_shared_memory`` do not
    apply.
    """

    counts_its_workers = True

    def __init__(
        self,
        dataset: Any,
        *args: Any,
        reuse_shared_memory: bool = True,
        profile: bool = False,
        stall_timeout: float | None = 300.0,
        decode_threads: int = 1,
        worker_type: str = "process",
        **kwargs: Any,
    ):
        from torch.utils.data import DataLoader

        bound = inspect.signature(DataLoader).bind(dataset, *args, **kwargs)
        loader_kwargs = {k: v for k, v in bound.arguments.items() if k != "dataset"}
        watch = LoaderWatch(profile, stall_timeout, decode_threads)
        self.factory = LoaderFactory(dataset, loader_kwargs, reuse_shared_memory, watch, worker_type)
        if self.factory.threaded and not isinstance(dataset, DataPipeline):
            raise TypeError(f"thread workers need a wdsx pipeline, not a {type(dataset).__name__}")
        super().__init__(LoaderSource(self.factory))
        if self.factory.threaded:
            self.factory.check_arguments()

    @property
    def dataset(self) -> Any:
        return self.factory.dataset

    @property
    def slots(self) -> int:
        """Number of reading streams in this process: the DataLoader workers, or 1."""
        return self.factory.slots

    def stats(self, reset: bool = False) -> LoaderStats:
        """Where this loader's time went since it was made (or last reset): per stage in the
        workers with ``profile=True``, collating, transport, and in the main process, waiting
        for data versus the trainer's turn. ``print()`` it for a table."""
        stats = copy.deepcopy(self.factory.watch.stats)
        if reset:
            self.factory.watch.stats.reset()
        return stats

    def __iter__(self) -> Iterator:
        dataset = self.dataset
        if isinstance(dataset, DataPipeline):
            if dataset.checkpoint_pending:
                raise StateError(
                    "a checkpoint was loaded into the dataset; load it into the WebLoader instead"
                )
            self.repetitions, self.nsamples = self.epoch_limits()
            topology = distributed.current(self._captured)
            dataset.prepare(topology, endless=self.nsamples > 0 or self.repetitions == sys.maxsize)
        return super().__iter__()

    def __len__(self) -> int:
        """Batches this rank's next ``iter()`` delivers (see :meth:`DataPipeline.__len__`), with
        the epoch's length as iterating sets it (a dataset's ``with_epoch(n)`` makes it ``n``
        per worker)."""
        self.repetitions, self.nsamples = self.epoch_limits()
        return super().__len__()

    def reads_each_sample_once(self) -> bool:
        dataset = self.dataset
        return (
            isinstance(dataset, DataPipeline)
            and dataset.reads_each_sample_once()
            and dataset.epoch_limits() == (1, -1)
        )

    def epoch_limits(self) -> tuple[int, int]:
        dataset = self.dataset
        if isinstance(dataset, DataPipeline) and self.nsamples <= 0 and dataset.continues_across_iters():
            # dataset.with_epoch(n): n items per worker per epoch. The workers stream without
            # end and the loader cuts its epochs at n x workers items, so each epoch continues
            # the streams where the last one stopped (checkpoints included). A dataset that
            # restarts instead runs one DataLoader pass per epoch, each worker yielding its n.
            return sys.maxsize, dataset.nsamples * self.slots
        return self.repetitions, self.nsamples

    def contributions(self) -> list[int]:
        """For a mixed dataset (:class:`~wdsx.Mix`): how many outputs each source has given in
        this epoch, over the batches this loader has delivered, summed over its workers (once
        an epoch has ended, and until the next one starts, in that epoch)."""
        dataset = self.dataset
        if not isinstance(dataset, Mix):
            raise TypeError(f"contributions() needs a wdsx.Mix dataset, not a {type(dataset).__name__}")
        progress = self._progress(self.epoch_progress_state())
        totals = [0] * len(dataset.mixer.sources)
        for worker_state in progress.states if progress is not None else []:
            totals = [a + b for a, b in zip(totals, dataset.contributions_in(worker_state))]
        return totals

    def skip_keys(self, keys: Iterable[str]) -> WebLoader:
        """Never deliver the samples with these keys: the workers' readers drop them."""
        super().skip_keys(keys)
        if isinstance(self.dataset, DataPipeline):
            self.dataset.skip_keys(self.skipped_keys)
        return self

    def shard_identities(self) -> list[tuple[str, Identity]]:
        dataset = self.dataset
        return dataset.shard_identities() if isinstance(dataset, DataPipeline) else []

    # --- elastic resume ---------------------------------------------------------------
    def load_state_dict(self, state: JsonDict, strict: bool = True, data_changed: str = "error") -> None:
        """Resume from a state saved by this loader, by a loader with a different number of
        workers, or (a :func:`gather_loader_state` result) by a job with different ranks.
        ``data_changed``: see :meth:`DataPipeline.load_state_dict`."""
        topology = distributed.current(self._captured)
        rank, world = topology.rank, topology.world_size
        if isinstance(state, dict) and state.get("format") == GLOBAL_FORMAT:
            saved_ranks = validate.listing(state, "ranks")
            if not saved_ranks:
                raise validate.invalid("ranks", "every rank's state (at least one)", saved_ranks)
            ranks = []
            for index, rank_state in enumerate(saved_ranks):
                with validate.within("ranks", index):
                    ranks.append(self.parse_state(rank_state))
                    self.check_data(rank_state, data_changed, strict)
                self.skip_keys(ranks[-1].skip_keys)
            progresses = [self._progress(rank_state) for rank_state in ranks]
            for index, progress in enumerate(progresses):
                # a missing or repeated rank would lose or repeat its share without a word
                if progress is not None and (progress.rank, progress.world) != (index, len(ranks)):
                    raise StateError(
                        f"the gathered loader state lists {len(ranks)} rank state(s), and its entry "
                        f"{index} is rank {progress.rank} of {progress.world}: it must hold every "
                        "rank's state, in rank order (gather_loader_state() gathers them over "
                        "torch.distributed, which must be initialised)"
                    )
            if len(ranks) == world and all(p is None or p.workers == self.slots for p in progresses):
                state = saved_ranks[rank]
            else:
                state = self._redealt(ranks, rank, world, strict).to_json()
        else:
            self.check_data(state, data_changed, strict)
            parsed = self.parse_state(state)
            progress = self._progress(parsed)
            if progress is not None and (progress.workers != self.slots or progress.world != world):
                if progress.world != world or world > 1:
                    # Re-dealing one rank's rest alone could leave the ranks with different
                    # numbers of batches (a hang under DDP): the re-deal needs every rank's.
                    raise StateError(
                        f"this loader state was saved by rank {progress.rank} of {progress.world} "
                        f"reading in {progress.workers} stream(s); to resume on {world} rank(s) reading "
                        f"in {self.slots}, gather every rank's state with gather_loader_state() and "
                        "load that"
                    )
                state = self._redealt([parsed], rank, world, strict).to_json()
        super().load_state_dict(state, strict, data_changed)

    def checked_state(
        self, state: Any, strict: bool = True, topology: distributed.Topology | None = None
    ) -> PipelineState:
        """The loader's own state checked as any pipeline's, and then each worker's state
        checked by the dataset, as the worker that resumes from it (so that a bad or
        mismatched one is found now, not in a worker process; with ``strict=False`` a
        mismatched one is replaced by what the dataset makes of it)."""
        parsed = super().checked_state(state, strict, topology)
        dataset = self.dataset
        saved = parsed.stages.get(LoaderSource.state_key)
        if saved is None or not isinstance(dataset, DataPipeline):
            return parsed
        where = topology or distributed.current(self._captured)
        if (saved["rank"], saved["world"]) != (where.rank, where.world_size):
            raise validate.InvalidState(
                ["stages", LoaderSource.state_key, "rank"],
                f"this process's rank {where.rank} of {where.world_size}",
                validate.Described(f"rank {saved['rank']} of {saved['world']}"),
            )
        workers, states = saved["workers"], list(saved["states"])
        for slot, (consumer, worker_state) in enumerate(zip(saved["consumers"], saved["states"])):
            if worker_state is None:
                continue
            reader = distributed.Topology(where.rank, where.world_size, consumer % workers, workers)
            with validate.within("stages", LoaderSource.state_key, "states", slot):
                checked = dataset.checked_state(worker_state, strict, reader)
            states[slot] = checked.to_json()
        parsed.stages[LoaderSource.state_key] = {**saved, "states": states}
        return parsed

    def _progress(self, state: PipelineState) -> LoaderProgress | None:
        saved = state.stages.get(LoaderSource.state_key)
        return None if saved is None else LoaderProgress.from_json(saved, state.table())

    def _redealt(
        self, rank_states: list[PipelineState], rank: int, world: int, strict: bool = True
    ) -> PipelineState:
        """This rank's share of a checkpoint re-dealt to the current ranks x workers."""
        dataset = self.dataset
        if not isinstance(dataset, DataPipeline):
            raise StateError("elastic resume needs a wdsx dataset")
        saved = [self._progress(rank_state) for rank_state in rank_states]
        started = next((p for p in saved if p is not None), None)
        if started is None and len({rank_state.epoch for rank_state in rank_states}) == 1:
            # taken before any batch of the epoch: the new topology starts it as a fresh run does
            return replace(rank_states[0], consumer=rank, consumers=world, stages={}, urls=[])
        if started is None:
            raise StateError("the ranks' checkpoints are in different epochs and none has begun its own")
        # a rank that had received nothing yet: all its readers' shares are unread
        progresses = [
            LoaderProgress.fresh(started.workers, old_rank, started.world) if p is None else p
            for old_rank, p in enumerate(saved)
        ]
        old_world = started.world
        # the old plans were made with the counts the dataset finds for the old topology
        dataset.prepare(distributed.Topology(0, old_world, 0, 1), dataset.nsamples > 0)
        readers: list[PipelineState] = []
        main_leftovers: list[Position] = []
        for rank_state, progress in zip(rank_states, progresses):
            for slot, reader_state in enumerate(progress.states):
                consumer = progress.consumers[slot]
                if reader_state is None:
                    readers.append(self._fresh_reader_state(rank_state, consumer, progress))
                else:
                    old = distributed.Topology(
                        progress.rank, progress.world, consumer % progress.workers, progress.workers
                    )
                    readers.append(dataset.checked_state(reader_state, strict, old))
            main_leftovers.extend(redeal.held_positions(rank_state, self.pipeline, skip=0))
        consumers = world * self.slots
        log.info(
            "re-dealing a checkpoint of %d readers to %d readers (%d ranks x %d)",
            len(readers),
            consumers,
            world,
            self.slots,
        )
        target = RedealTarget(old_world, consumers, world)
        new_states = redeal.redeal(readers, main_leftovers, dataset.pipeline, target)
        progress = LoaderProgress.fresh(self.slots, rank, world)
        progress.states = [
            state.to_json() for state in new_states[rank * self.slots : (rank + 1) * self.slots]
        ]
        template = rank_states[0]
        table = PositionTable()
        # what the loader's own stages hand every new rank (a packer's counts of tokens emitted)
        carried = redeal.carried_states(rank_states, self.pipeline, table, skip=0)
        return PipelineState(
            template.fingerprint,
            template.seed,
            rank,
            world,
            template.epoch,
            {LoaderSource.state_key: progress.to_json(table), **carried},
            table.urls,
            nominal=template.nominal,
            passes=template.passes,
            skip=template.skip,
            skip_keys=template.skip_keys,
        )

    def _fresh_reader_state(
        self, rank_state: PipelineState, consumer: int, progress: LoaderProgress
    ) -> PipelineState:
        """The state of a reader that had not delivered anything yet in this epoch."""
        return PipelineState(
            self.dataset.fingerprint(),
            self.dataset.seed,
            consumer,
            progress.world * progress.workers,
            rank_state.epoch,
        )


def gather_loader_state(loader: WebLoader, group: Any = None) -> JsonDict:
    """All ranks' loader states in one JSON-serialisable checkpoint, returned on every rank.

    Call it on every rank at the same step (it is a ``torch.distributed`` collective). Save the
    result from rank 0; when resuming, load it on every rank with ``loader.load_state_dict``:
    the same topology takes its own part, a different one is re-dealt.
    """
    return gather_states(loader.state_dict(), group)


def gather_states(state: JsonDict, group: Any = None) -> JsonDict:
    """Every rank's ``state`` (a loader state each rank took at the same step) in one global
    checkpoint, returned on every rank (a ``torch.distributed`` collective when initialised)."""
    import torch.distributed as dist

    state = as_json(state)
    if not (dist.is_available() and dist.is_initialized()):
        return {"format": GLOBAL_FORMAT, "version": VERSION, "ranks": [state]}
    states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, state, group=group)
    return {"format": GLOBAL_FORMAT, "version": VERSION, "ranks": states}


def split_loader_state(global_state: JsonDict, rank: int) -> JsonDict:
    """One rank's part of a gathered checkpoint saved with the same topology."""
    if not isinstance(global_state, dict) or global_state.get("format") != GLOBAL_FORMAT:
        raise StateError(f"not a {GLOBAL_FORMAT} checkpoint")
    return global_state["ranks"][rank]


__all__ = ["WebLoader", "gather_loader_state", "split_loader_state", "FORMAT"]
