"""DataPipeline: an ordered list of stages, iterated one epoch at a time, with exact state.

``DataPipeline(*stages)`` accepts what webdataset's does (our stages, plain functions of an
iterator, lists, datasets), and adds ``state_dict()`` / ``load_state_dict()``. A state taken
at any point between two items resumes, in a fresh process, with exactly the items an
uninterrupted run would have produced next.
"""

from __future__ import annotations

import copy
import itertools
import logging
import operator
import sys
import warnings
from collections.abc import Generator, Iterable, Iterator
from dataclasses import replace
from typing import Any, cast

from wdsx.core import topology as distributed
from wdsx.core.env import seed_from_environment, seed_number
from wdsx.core.errors import NotResumableError, StateError
from wdsx.core.torchdataset import iterable_dataset
from wdsx.pipeline.fluid import FluidInterface
from wdsx.read.progress import ReaderProgress
from wdsx.stages.base import Count, Run, Stage, StageList, source_index, stage_keys
from wdsx.stages.custom import PipelineStage
from wdsx.stages.observe import StageObserver
from wdsx.stages.plan import execution_stages
from wdsx.stages.reading import ShardReader
from wdsx.state import fingerprint as data_fingerprint
from wdsx.state import masking, validate
from wdsx.state.checkpoint import FORMAT as STATE_FORMAT
from wdsx.state.checkpoint import VERSION, JsonDict, PipelineState, check_format, fingerprint_differences
from wdsx.state.position import Position, PositionTable, as_json

log = logging.getLogger("wdsx")


def default_seed(seed: int | str | None) -> int:
    """The seed to use: the one given, else ``WDS_SEED``, else 0 (the same on every rank)."""
    return seed_number(seed) if seed is not None else seed_from_environment()


_NOTHING = object()
_FIRST = operator.itemgetter(0)


def _count_value(counter: itertools.count) -> int:
    """The number an ``itertools.count`` yields next, read without advancing it. Zipping a
    stream with a counter counts its items without a Python-level step per item (the hot
    path of raw iteration); the counter shows its value only in its repr, ``count(n)``."""
    return int(repr(counter)[len("count(") : -1])


class _Stream:
    """One iteration over a pipeline: runs epoch after epoch, as many as requested."""

    def __init__(self, pipeline: DataPipeline, start: PipelineState | None):
        self.pipeline = pipeline
        self.start = start
        self.epoch = start.epoch if start else pipeline._next_epoch
        self.nominal = start.nominal if start else 0
        # passes of repeat(n) still to run in this iter(), the current one included
        self.passes = (start.passes if start else 0) or pipeline.repetitions
        self.topology = pipeline._topology(start)
        self.run: Run | None = None
        self.started = False
        self.table = start.table() if start else PositionTable()
        self.table.deferred = pipeline.defer_positions
        # the with_epoch(n) this stream was made for: only such a stream continues across iter()
        self.limit = pipeline.nsamples
        # items yielded in the current epoch, counted at C speed (see _counted)
        self.counter = itertools.count(start.yielded if start else 0)
        # items still to read and drop before the next one is yielded (pipeline.skip(n))
        self.skip_left = start.skip if start else 0
        self.ended: Run | None = None
        """The run of the last epoch this stream finished, whose stage states say what it delivered."""
        self.items = self._generate()

    @property
    def yielded(self) -> int:
        """Items this stream has yielded in its current epoch."""
        return _count_value(self.counter)

    def _generate(self) -> Generator[Any, None, None]:
        pipeline = self.pipeline
        restore = self.start
        if restore is not None and restore.finished:  # a share that had run out (see state())
            pipeline._next_epoch = self.epoch + 1
            return
        while self.passes > 0:
            self.started = True
            stages = execution_stages(pipeline.pipeline, pipeline.decode_threads)  # same items, less work
            run = Run(stages, self.epoch, pipeline.seed, self.topology, restore, self.table)
            self.run = run
            pipeline._next_epoch = self.epoch + 1
            chain: Iterator = iter(())
            observer = pipeline.observer
            if observer is not None:
                observer.start(stages)
            for index, stage in enumerate(stages):
                chain = stage.apply(chain, run, index)
                if index == run.source_index and stage.reads_shards and pipeline.skipped_keys:
                    chain = _without_keys(chain, pipeline.skipped_keys)
                if observer is not None:
                    chain = observer.wrap(chain, run, index)
            base = self.yielded if restore else 0
            if self.skip_left:
                dropped = sum(1 for _ in itertools.islice(chain, self.skip_left))
                self.skip_left -= dropped
                base += dropped
            self.counter = itertools.count(base)
            first = next(chain, _NOTHING)
            if first is not _NOTHING:
                self.counter = itertools.count(base + 1)
                yield first
                yield from map(_FIRST, zip(chain, self.counter))
            self.ended = run
            self.run = None
            self.epoch += 1
            self.passes -= 1
            if first is _NOTHING and not restore:
                break  # an empty dataset: repeating it would loop forever
            restore = None

    def ended_state(self, fingerprint: list[str], seed: int) -> PipelineState | None:
        """The state at the end of the last epoch this stream finished, if it finished one."""
        run = self.ended
        if run is None:
            return None
        state = PipelineState(fingerprint, seed, self.topology.consumer, self.topology.consumers, run.epoch)
        state.stages, state.urls = run.snapshot(), list(self.table.urls)
        return state

    def state(self, fingerprint: list[str], seed: int) -> PipelineState:
        """The state at the point between the last item yielded and the next."""
        topology = self.topology
        state = PipelineState(fingerprint, seed, topology.consumer, topology.consumers, self.epoch)
        if not self.started and self.start is not None:
            state.epoch, state.stages, state.urls = self.start.epoch, dict(self.start.stages), self.start.urls
            state.finished = self.start.finished  # a share that had run out stays finished
        elif self.run is not None:
            state.epoch, state.stages = self.run.epoch, self.run.snapshot()
        state.nominal, state.passes, state.yielded = self.nominal, self.passes, self.yielded
        state.skip = self.skip_left
        state.urls = list(self.table.urls) if self.started else state.urls
        if self.started and self.run is None and self.passes <= 0 and _in_plain_loader_worker():
            # torchdata's StatefulDataLoader keeps the state a worker's dataset had when its
            # share ran out, and resumes that worker from it while the others finish the epoch:
            # it must deliver nothing more in this epoch, not start the next one
            state.epoch, state.finished = self.epoch - 1, True
        return state


def _in_plain_loader_worker() -> bool:
    """In a DataLoader worker that is not a WebLoader's (torch's own, or torchdata's)."""
    return distributed.in_worker() and not distributed.in_loader_worker()


@iterable_dataset
class DataPipeline(FluidInterface):
    """A pipeline of stages; iterable, picklable, checkpointable.

    Args:
        *stages: stages in order; the first produces items (a shard list, a reader, an
            iterable), the others transform the stream. ``None`` is skipped, lists are spliced.
        seed: seed for every random choice (shard order, shuffle buffers). Defaults to
            ``WDS_SEED`` or 0, so that every rank and every restart agrees. Text is taken as
            webdataset takes it: a number as that number, other text through a hash.
    """

    observer: StageObserver | None = None
    """Watches the stages run (per-stage time, the reader's position): set by ``wdsx bench
    --profile`` and by WebLoader workers (:mod:`wdsx.stages.observe`)."""

    defer_positions: bool = False
    """Whether stage states hold positions as tables, packed into their compact text only when
    a checkpoint is read (:class:`~wdsx.state.position.PackedPositions`): set in WebLoader
    workers, which write a state with every batch."""

    counts_its_workers: bool = False
    """Whether ``with_epoch(n)`` gives this pipeline's ``len()``: True for a loader, whose
    epoch length counts all its workers' items; a dataset's ``with_epoch(n)`` holds for each
    DataLoader worker, which it cannot count."""
    decode_threads: int = 1
    """Threads that decode each batch's images, where decoding goes straight into batches
    (:mod:`wdsx.stages.plan`); WebLoader's ``decode_threads`` sets it in its workers."""

    skipped_keys: frozenset[str] = frozenset()
    """Keys of samples this pipeline never delivers (:meth:`skip_keys`); checkpoints keep them."""

    _data: JsonDict | None = None
    """The shards' identities, found once (:meth:`data_identity`)."""
    _masks: masking.UrlMasks | None = None
    """How checkpoints show the shards' URLs, worked out once (:meth:`url_masks`)."""

    def __init__(self, *stages: Any, seed: int | str | None = None):
        self.pipeline = StageList()
        for item in stages:
            if item is None:
                continue
            self.pipeline.extend(item if isinstance(item, list) and item and _all_stages(item) else [item])
        self.seed = default_seed(seed)
        self.repetitions = 1
        self.nsamples = -1
        self.size: int | None = None
        self._next_epoch = 0
        self._pending: PipelineState | None = None
        self._live: _Stream | None = None
        self._captured = distributed.capture()

    # --- building ---------------------------------------------------------------------
    def compose(self, *stages: Any) -> DataPipeline:
        """A copy of this pipeline with ``stages`` appended (the original is unchanged)."""
        if self._pending is not None:
            raise StateError(
                "a checkpoint was loaded into this pipeline and would not reach the extended copy; "
                "load it into the finished pipeline instead"
            )
        result = object.__new__(type(self))
        result.__dict__.update(self.__dict__)
        result.pipeline = StageList([*self.pipeline, *stages])
        result._live = None
        return result

    def detached(self) -> DataPipeline:
        """A copy sharing this pipeline's stages and settings but neither its running
        iteration nor a loaded checkpoint (for running one pipeline in several places)."""
        result = copy.copy(self)
        result._live, result._pending = None, None
        return result

    @property
    def pipeline(self) -> StageList:
        """The stages, in order: a list that, as in webdataset, may be edited in place or
        replaced (what goes into it becomes a stage as the constructor makes one)."""
        return self._stages

    @pipeline.setter
    def pipeline(self, stages: Iterable[Any]) -> None:
        self._stages = stages if isinstance(stages, StageList) else StageList(stages)

    def __add__(self, other: Any) -> Any:
        """``a + b``: torch's ``ChainDataset`` of the two, as ``+`` gives for webdataset's
        pipelines (torch ``IterableDataset`` subclasses)."""
        from torch.utils.data import ChainDataset

        return ChainDataset([cast(Any, self), other])

    def append(self, stage: Any) -> None:
        """Add a stage to this pipeline in place."""
        self.pipeline.append(stage)

    def stage(self, index: int) -> Stage:
        return self.pipeline[index]

    def with_length(self, n: int, silent: bool = False) -> DataPipeline:
        """Give the pipeline a ``len()`` (for frameworks that insist); it does not change how
        many items an epoch yields. Unlike webdataset's, the result stays picklable."""
        if not silent:
            warnings.warn(
                ".with_length() only sets __len__; it does not change the epoch's length", stacklevel=2
            )
        self.size = n
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> DataPipeline:
        """Make each ``iter()`` yield exactly this many items from an endless stream.

        The stream continues where the previous ``iter()`` stopped (webdataset restarts it),
        running through as many epochs of the data as needed; a pipeline that cannot be
        checkpointed restarts it, as webdataset does (see :meth:`continues_across_iters`).
        """
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> DataPipeline:
        """Run through the data ``nepochs`` times per ``iter()`` (forever if negative), each
        pass with its own shard order, stopping after ``nbatches`` items if given."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        return self

    def continues_across_iters(self) -> bool:
        """True when ``with_epoch(n)`` makes each ``iter()`` continue the stream the last one
        left, False when each ``iter()`` restarts it. It continues when the pipeline can be
        checkpointed, so that a resumed run carries on mid-stream. A pipeline with a stage wdsx
        cannot checkpoint (a function of the stream, a webdataset ``PipelineStage``) restarts,
        as on webdataset: such stages were written for a pass that starts with each
        ``iter()``, and some choose their order then (open_clip's shard shuffle reads the epoch
        its trainer has just set)."""
        return self.nsamples > 0 and not self.not_resumable()

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next ``iter()`` runs (as with DistributedSampler.set_epoch)."""
        if self._pending is not None and self._pending.epoch != epoch:
            raise StateError(
                f"set_epoch({epoch}) after loading a checkpoint of epoch {self._pending.epoch}: "
                "the checkpoint would be ignored"
            )
        self._next_epoch = epoch

    def __repr__(self) -> str:
        """The pipeline as a person reads it: the class around its first stage, then the other
        stages and the epoch settings, e.g. ``WebDataset(3 shards from a-0.tar, shuffled) |
        shuffle(1000, initial=100) | decode(rgb) | batched(16, partial=True)``."""
        name = type(self).__name__
        parts = [f"{name}({self.pipeline[0]!r})" if self.pipeline else f"{name}()"]
        parts += [repr(stage) for stage in self.pipeline[1:]]
        endless = self.repetitions == sys.maxsize
        if self.nsamples > 0:
            parts.append(
                f"with_epoch({self.nsamples})" if endless else f"repeat({self.repetitions}, {self.nsamples})"
            )
        elif self.repetitions != 1:
            parts.append("repeat()" if endless else f"repeat({self.repetitions})")
        if self.size is not None:
            parts.append(f"with_length({self.size})")
        return " | ".join(parts)

    def __len__(self) -> int:
        """Items the next ``iter()`` yields in this process: from ``with_length(n)``, else
        computed from the per-shard sample counts and the stages (a pipeline resumed from a
        checkpoint reports what is left of its epoch). A ``TypeError`` says why when that
        cannot be known: also for a dataset with ``with_epoch(n)``, as on webdataset, because
        each DataLoader worker then yields ``n`` items, and a ``len()`` of ``n`` would end
        a trainer's epoch (Lightning's) after a share of it. A loader's own ``with_epoch(n)``
        gives its length."""
        if self.size is not None:
            return self.size
        if self.nsamples > 0 and not self.counts_its_workers:
            raise TypeError(
                f"{type(self).__name__}.with_epoch({self.nsamples}) has no len(): every DataLoader worker "
                "yields that many items. Call with_epoch on the WebLoader for a length per rank, or "
                "give one with .with_length(n)"
            )
        topology = distributed.current(self._captured)
        self.prepare(topology, endless=self.nsamples > 0 or self.repetitions == sys.maxsize)
        return max(0, self.epoch_count(topology, restore=self._pending).items - self._yielded_already())

    def _yielded_already(self) -> int:
        """Items of the epoch (of the ``with_epoch(n)`` pass) a pending checkpoint has
        delivered or is still to skip."""
        pending = self._pending
        if pending is None:
            return 0
        return (pending.nominal if self.nsamples > 0 else pending.yielded) + pending.skip

    def _epoch_to_count(self) -> int:
        return self._pending.epoch if self._pending is not None else self._next_epoch

    def epoch_count(
        self,
        topology: distributed.Topology,
        epoch: int | None = None,
        restore: PipelineState | None = None,
    ) -> Count:
        """What one ``iter()`` of this pipeline yields for the reader at ``topology``: its
        passes (one per ``repeat(n)`` pass, each an epoch of its own) from ``epoch`` on
        (default: the epoch its next ``iter()`` reads; a loader or a mixture that drives this
        pipeline's epochs names its own). The first pass is counted from the start of its
        epoch or, for a share re-dealt by ``restore`` (an elastic resume), from the re-deal;
        ``restore`` also says how many passes are left."""
        if self.nsamples > 0:
            return Count(self.nsamples, self.nsamples, False)
        if self.repetitions == sys.maxsize:
            raise TypeError(f"{type(self).__name__} repeats without end: it has no len()")
        index = source_index(self.pipeline)
        if index is None:
            raise TypeError(
                f"{type(self).__name__} has no len(); use .with_length(n) if a framework needs one "
                "(if a torch DataLoader asks, import torch before creating the dataset)"
            )
        epoch = self._epoch_to_count() if epoch is None else epoch
        # (a loader that runs without end because of its dataset's with_epoch(n) saves endless
        # passes, and knows it only once it iterates: its count is then its dataset's)
        passes = (
            min(restore.passes, self.repetitions)
            if restore is not None and restore.passes
            else self.repetitions
        )
        counts = [
            self._pass_count(topology, epoch + done, restore if done == 0 else None) for done in range(passes)
        ]
        return Count(
            sum(c.items for c in counts), sum(c.samples for c in counts), all(c.single for c in counts)
        )

    def share_count(self, topology: distributed.Topology, epoch: int, saved: JsonDict | None) -> Count:
        """What the reader at ``topology`` yields in ``epoch``, for a loader or a mixture that
        drives this pipeline: counted from the re-deal where its ``saved`` state holds a share
        re-dealt by an elastic resume, else from the epoch's start (what it already delivered
        is subtracted by the driver)."""
        restore = None if saved is None else self.parse_state(saved)
        if restore is not None and self.redealt(restore):
            return self.epoch_count(topology, restore.epoch, restore)
        return self.epoch_count(topology, epoch)

    def redealt(self, state: PipelineState) -> bool:
        """Whether ``state`` holds a share re-dealt by an elastic resume (which is counted from
        the re-deal, see :meth:`epoch_count`)."""
        index = source_index(self.pipeline)
        if index is None:
            return False
        saved = state.stages.get(stage_keys(self.pipeline)[index])
        return self.pipeline[index].redealt(saved, state.table())

    def _pass_count(self, topology: distributed.Topology, epoch: int, restore: PipelineState | None) -> Count:
        """What one pass of this pipeline yields in ``epoch`` (see :meth:`epoch_count`)."""
        index = source_index(self.pipeline)
        assert index is not None
        run = Run(self.pipeline, epoch, self.seed, topology, restore)
        count = self.pipeline[index].source_count(self.pipeline, index, run)
        if count is None:
            raise TypeError(f"{self.pipeline[index].describe()} cannot say how many items an epoch has")
        for stage in self.pipeline[index + 1 :]:
            count = stage.count_after(count)
            if count is None:
                raise TypeError(f"{stage.describe()} changes the number of items unpredictably: no len()")
        return count

    # --- iterating --------------------------------------------------------------------
    def __iter__(self) -> Iterator:
        if self._overrides_iteration():
            return self._through_overrides()
        if self.continues_across_iters():
            live = self._live
            if live is None or self._pending is not None or live.limit != self.nsamples:
                live = self._live = _Stream(self, self._take_pending())
            return self._limited(live, self.nsamples)
        self._live = _Stream(self, self._take_pending())
        return self._limited(self._live, self.nsamples) if self.nsamples > 0 else self._live.items

    def iterator(self) -> Iterator:
        """webdataset's name for iterating every pass of ``repeat(n)`` without the
        ``with_epoch`` limit (code written for webdataset calls or overrides it)."""
        self._live = _Stream(self, self._take_pending())
        return self._live.items

    def iterator1(self) -> Iterator:
        """webdataset's name for iterating one pass of the stages."""
        items = self.iterator()
        assert self._live is not None
        self._live.passes = 1  # read when the stream starts
        return items

    def _overrides_iteration(self) -> bool:
        """Whether a subclass overrides webdataset's :meth:`iterator` or :meth:`iterator1`."""
        return (
            type(self).iterator is not DataPipeline.iterator
            or type(self).iterator1 is not DataPipeline.iterator1
        )

    def _through_overrides(self) -> Iterator:
        """Iterate as webdataset does, for a subclass that overrides :meth:`iterator` or
        :meth:`iterator1`: through its methods, and without checkpoints."""
        stream = self.iterator() if type(self).iterator is not DataPipeline.iterator else self._passes()
        return itertools.islice(stream, self.nsamples) if self.nsamples > 0 else stream

    def _passes(self) -> Iterator:
        """The passes of ``repeat(n)``, each from :meth:`iterator1`, ending early at an empty one."""
        for _ in range(self.repetitions):
            empty = True
            for item in self.iterator1():
                empty = False
                yield item
            if empty:
                return

    def invoke(self, stage: Any, *args: Any, **kwargs: Any) -> Any:
        """webdataset's helper that applies one stage by hand: a ``PipelineStage`` is run, a
        function (or a wdsx stage) is called with ``args`` (the upstream iterator), and a
        dataset or list given alone is iterated."""
        if isinstance(stage, PipelineStage):
            return stage.run(*args, **kwargs)
        if callable(stage):
            return stage(*args, **kwargs)
        if isinstance(stage, Iterable) and not args:
            return iter(stage)
        raise ValueError(f"{stage!r}: not a pipeline stage")

    def _limited(self, stream: _Stream, limit: int) -> Iterator:
        items = stream.items
        while stream.nominal < limit:
            try:
                item = next(items)
            except StopIteration:
                self._live = None
                return
            stream.nominal += 1
            yield item
        stream.nominal = 0

    @property
    def checkpoint_pending(self) -> bool:
        """True between ``load_state_dict`` and the ``iter()`` that resumes from it."""
        return self._pending is not None

    def prepare(self, topology: distributed.Topology, endless: bool) -> None:
        """Called before iterating with the readers' topology; a dataset that needs to know
        more before dealing an epoch (sample counts) finds it here. Nothing by default."""

    def _take_pending(self) -> PipelineState | None:
        pending, self._pending = self._pending, None
        if pending is not None:
            log.info("resuming %s at epoch %d", type(self).__name__, pending.epoch)
        return pending

    def _topology(self, start: PipelineState | None) -> distributed.Topology:
        topology = distributed.current(self._captured)
        if start is not None:
            saved = (start.consumer, start.consumers)
            if saved != (topology.consumer, topology.consumers):
                raise StateError(
                    f"checkpoint belongs to reader {saved[0]} of {saved[1]}, but this is reader "
                    f"{topology.consumer} of {topology.consumers} "
                    f"(rank {topology.rank}/{topology.world_size}, "
                    f"worker {topology.worker}/{topology.num_workers}); resume through WebLoader, which "
                    "re-deals checkpoints across a different number of ranks or workers"
                )
        return topology

    # --- checkpointing ----------------------------------------------------------------
    def fingerprint(self) -> list[str]:
        """What a checkpoint must match: the stages (and through the reader, the shard list)."""
        return [stage.describe() for stage in self.pipeline]

    def not_resumable(self) -> list[str]:
        """Reasons a checkpoint of this pipeline would not resume exactly (empty when it would)."""
        reasons = []
        source = source_index(self.pipeline)
        for index, stage in enumerate(self.pipeline):
            replayed = source is not None and index < source  # from the epoch start, on resume
            reason = stage.not_replayable() if replayed else stage.not_resumable()
            if reason:
                reasons.append(f"stage {index}: {reason}")
        if source is None and self.pipeline:
            reasons.append("no stage reads shards (tarfile_to_samples or WebDataset), so no positions exist")
        if self._overrides_iteration():
            reasons.append(
                f"{type(self).__qualname__} overrides iterator() or iterator1(), which wdsx cannot checkpoint"
            )
        return reasons

    def state_dict(self, strict: bool = True) -> JsonDict:
        """The state after the last item this process took from the pipeline; JSON-serialisable.

        Raises :class:`NotResumableError` if the pipeline holds something that cannot be
        restored exactly, unless ``strict=False`` (then it warns and says what will differ).
        """
        reasons = self.not_resumable()
        if reasons:
            message = "this pipeline cannot be checkpointed exactly: " + "; ".join(reasons)
            if strict:
                raise NotResumableError(message)
            warnings.warn(message + " (strict=False: resuming restarts those stages)", stacklevel=2)
        state = self.current_state()
        state.data = self.data_identity()
        return validate.signed(self.url_masks().masked(as_json(state.to_json())))

    def epoch_progress_state(self) -> PipelineState:
        """The state that says what this epoch has delivered: the current one, or, once an
        epoch has ended and until the next one starts, the state at its end (where the
        current state already stands at the next epoch's start)."""
        live = self._live
        if self._pending is None and live is not None and live.run is None:
            ended = live.ended_state(self.fingerprint(), self.seed)
            if ended is not None:
                return ended
        return self.current_state()

    def current_state(self) -> PipelineState:
        """The current state, without checking that it can be restored exactly."""
        if self._pending is not None:
            state = copy.deepcopy(self._pending)
        elif self._live is not None:
            state = self._live.state(self.fingerprint(), self.seed)
        else:
            topology = distributed.current(self._captured)
            state = PipelineState(
                self.fingerprint(), self.seed, topology.consumer, topology.consumers, self._next_epoch
            )
        state.skip_keys = sorted(self.skipped_keys)
        return state

    # --- skipping and the data's identity ---------------------------------------------
    def skip(self, n: int) -> DataPipeline:
        """Read and drop the next ``n`` items (batches, where the pipeline batches) where the
        next ``iter()`` starts: after ``load_state_dict()``, or before the first ``iter()``.
        A checkpoint taken before they are dropped keeps the count, so its resume drops them
        too. Returns the pipeline."""
        if n < 0:
            raise ValueError(f"skip() needs a count >= 0, got {n}")
        if self._pending is None:
            if self._live is not None:
                raise StateError(
                    "skip() applies where the next iter() starts: call it after load_state_dict() "
                    "or before the pipeline is first iterated"
                )
            self._pending = self.current_state()
        self._pending.skip += n
        return self

    def skip_keys(self, keys: Iterable[str]) -> DataPipeline:
        """Never deliver the samples with these ``__key__`` values, from the samples the
        reader reads next on (one already held in a buffer is still delivered). Checkpoints
        keep the keys, and loading one adds its keys to the pipeline's. Returns the pipeline."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        if any(not isinstance(key, str) for key in keys):
            raise TypeError("skip_keys() takes sample keys (strings)")
        self.skipped_keys = self.skipped_keys | frozenset(keys)
        return self

    def shard_identities(self) -> list[tuple[str, data_fingerprint.Identity]]:
        """Each shard this pipeline reads with its size and SHA-256 (None where unknown): a
        local file's own size, else the manifest's, and the manifest's hash
        (:mod:`wdsx.state.fingerprint`)."""
        index = source_index(self.pipeline)
        return data_fingerprint.identities(self.pipeline[index]) if index is not None else []

    def data_identity(self) -> JsonDict | None:
        """What a checkpoint records about the shards, found once per pipeline (None for a
        pipeline that reads no shards)."""
        if self._data is None:
            shards = self.shard_identities()
            self._data = data_fingerprint.record(shards) if shards else {}
        return self._data or None

    def parse_state(self, data: JsonDict) -> PipelineState:
        """A checkpoint of this pipeline, of any version this wdsx reads, as today's type (its
        envelope checked field by field, and its digest; see :meth:`checked_state`), with this
        pipeline's own shard URLs where the checkpoint shows them masked."""
        return self.url_masks().unmasked(PipelineState.from_json(data, self.upgrade_state))

    def url_masks(self) -> masking.UrlMasks:
        """How this pipeline's checkpoints show its shard URLs (credentials masked)."""
        if self._masks is None:
            shards = (self.data_identity() or {}).get("shards", [])
            self._masks = masking.UrlMasks(entry[0] for entry in shards)
        return self._masks

    def upgrade_state(self, data: JsonDict) -> JsonDict:
        """A version-2 checkpoint of this pipeline in today's form: version 2 keyed stage
        states by their index in the pipeline, and some stages stored them differently."""
        check_format(data, STATE_FORMAT)
        try:
            problems = fingerprint_differences(data["fingerprint"]["stages"], self.fingerprint())
            if problems:
                raise StateError("version-2 checkpoint does not match this pipeline: " + "; ".join(problems))
            keys = stage_keys(self.pipeline)
            table = PositionTable(data.get("urls", []))
            stages = {
                keys[int(index)]: self.pipeline[int(index)].upgrade_state(saved, table)
                for index, saved in data.get("stages", {}).items()
            }
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
            raise StateError(f"malformed version-2 {STATE_FORMAT} checkpoint: {error!r}") from error
        return {**data, "version": VERSION, "stages": stages, "urls": table.urls}

    def load_state_dict(self, state: JsonDict, strict: bool = True, data_changed: str = "error") -> None:
        """Resume from ``state`` at the next ``iter()``. The whole state is checked here (see
        :meth:`checked_state`): a bad one raises :class:`StateError` now, not when iterating.
        With ``strict=False``, a state of other stages, another shard list or another seed
        warns instead of raising, and resumes what still applies. A state taken on other data
        (a shard added, removed, resized or with other content) is refused naming the shards,
        unless ``data_changed="allow"`` (or ``strict=False``), which logs the changes."""
        self.check_data(state, data_changed, strict)
        pending = self.checked_state(state, strict)
        self._pending, self._live = pending, None
        self.skip_keys(pending.skip_keys)

    def check_data(self, state: JsonDict, data_changed: str = "error", strict: bool = True) -> None:
        """Refuse ``state`` if it was taken on other shards than this pipeline reads (see
        :mod:`wdsx.state.fingerprint`), unless ``data_changed="allow"`` or ``strict=False``
        (which accepts another shard list anyway): then log the changes."""
        allow = data_fingerprint.allowed(data_changed) or not strict
        saved = self.parse_state(state).data
        if saved is None:  # a worker's or a source's state, or one older than the record
            return
        current = data_fingerprint.parse(self.data_identity() or {"shards": []})
        changes = data_fingerprint.check(saved, current, allow)
        if changes:
            log.warning("resuming on changed data (data_changed=%r): %s", data_changed, "; ".join(changes))

    def checked_state(
        self, state: Any, strict: bool = True, topology: distributed.Topology | None = None
    ) -> PipelineState:
        """``state`` parsed and checked completely against this pipeline, as the reader at
        ``topology`` (default: this process) would resume from it: its envelope and digest,
        its fingerprint and seed, every stage state by the stage's own type, and each state
        against what the pipeline knows (a reader's cursor within its share of the epoch, no
        sample held twice, ``repeat``/``with_epoch`` counts within their limits).

        With ``strict=False``, a state of other stages, another shard list or another seed
        warns instead: the checkpoint's seed is adopted (so that its random choices stay the
        same), and the states of the stages that differ are dropped (those stages start
        their epoch afresh; all of them when the shard reader differs)."""
        parsed = self.parse_state(state)
        current = self.fingerprint()
        problems = fingerprint_differences(parsed.fingerprint, current)
        if parsed.seed != self.seed:
            problems.append(f"seed differs: checkpoint has {parsed.seed}, pipeline has {self.seed}")
        if problems:
            message = "checkpoint does not match this pipeline: " + "; ".join(problems)
            if strict:
                raise StateError(message)
            kept = _matching_stage_states(self.pipeline, parsed.fingerprint, current, parsed.stages)
            dropped = sorted(set(parsed.stages) - set(kept))
            consequence = f"resuming epoch {parsed.epoch} with the checkpoint's seed {parsed.seed}"
            if dropped:
                consequence += "; these stages start the epoch afresh: " + ", ".join(dropped)
            warnings.warn(f"{message} (strict=False: {consequence})", stacklevel=3)
            self.seed, parsed.stages, parsed.fingerprint = parsed.seed, kept, current
        where = topology or distributed.current(self._captured)
        if (parsed.consumer, parsed.consumers) != (where.consumer, where.consumers):
            raise validate.invalid(
                "topology",
                f"[{where.consumer}, {where.consumers}], this reader (rank {where.rank} of "
                f"{where.world_size}, worker {where.worker} of {where.num_workers}); resume through "
                "WebLoader, which re-deals checkpoints across a different number of ranks or workers",
                [parsed.consumer, parsed.consumers],
            )
        self._check_epoch_progress(parsed)
        _check_stage_states(self.pipeline, parsed, where, self.reads_each_sample_once())
        return parsed

    def reads_each_sample_once(self) -> bool:
        """Whether no sample can come twice within an epoch's stream (so a checkpoint's
        buffers never hold one position twice): a shard reader that does not draw with
        replacement."""
        source = source_index(self.pipeline)
        reader = self.pipeline[source] if source is not None else None
        return isinstance(reader, ShardReader) and not reader.resampled

    def epoch_limits(self) -> tuple[int, int]:
        """``(passes, items)`` an ``iter()`` runs: the passes of ``repeat(n)`` and the items
        of ``with_epoch(n)`` (-1: no limit)."""
        return self.repetitions, self.nsamples

    def _check_epoch_progress(self, state: PipelineState) -> None:
        """Refuse a state whose ``repeat(n)`` or ``with_epoch(n)`` counts this pipeline
        cannot have reached."""
        passes, items = self.epoch_limits()
        if state.passes > passes:
            raise validate.invalid("passes", f"at most the {passes} passes of repeat()", state.passes)
        if items > 0 and state.nominal > items:
            raise validate.invalid("nominal", f"at most the {items} items of with_epoch()", state.nominal)

    # --- pickling and cleanup ---------------------------------------------------------
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_live"] = None
        state["_captured"] = distributed.capture()
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        if "pipeline" in state:  # pickled by a wdsx whose stage list was a plain attribute
            state["_stages"] = StageList(state.pop("pipeline"))
        self.__dict__.update(state)

    def close(self) -> None:
        """Release the live iteration (open shards are closed when its generators close)."""
        if self._live is not None:
            self._live.items.close()
            self._live = None

    def current_position(self) -> Any:
        """Position(s) of the item most recently yielded by the live iteration."""
        run = self._live.run if self._live is not None else None
        return run.position if run is not None else None


def _matching_stage_states(
    stages: list[Stage], saved: list[str], current: list[str], states: dict[str, JsonDict]
) -> dict[str, JsonDict]:
    """The stage states of a checkpoint of other stages that still apply: those of stages
    described alike, when the stage list has the same length and the same shard reader."""
    source = source_index(stages)
    if source is None or len(saved) != len(current) or saved[source] != current[source]:
        return {}
    same = {key for key, a, b in zip(stage_keys(stages), saved, current) if a == b}
    return {key: state for key, state in states.items() if key in same}


def _check_stage_states(
    stages: list[Stage], state: PipelineState, topology: distributed.Topology, once: bool
) -> None:
    """Parse every stage state of ``state`` with its stage's own type, and check those that
    depend on the pipeline: the reader's progress within its share, and (``once``: where
    every sample is read once) no position held twice."""
    source = source_index(stages)
    owners = {
        key: (index, stage)
        for index, (key, stage) in enumerate(zip(stage_keys(stages), stages))
        if stage.state_type is not None and (source is None or index >= source)
    }
    table = state.table()
    held: dict[Position, str] = {}
    for key, saved in state.stages.items():
        with validate.within("stages", key):
            if key not in owners:
                raise validate.InvalidState(
                    [], f"the state of one of this pipeline's stages ({', '.join(owners) or 'none'})", saved
                )
            index, stage = owners[key]
            assert stage.state_type is not None
            parsed = stage.state_type.from_json(saved, table)
            stage.check_state(parsed)
            for position in parsed.held():
                if once and position in held:
                    raise validate.InvalidState(
                        [],
                        "a buffer that holds each sample once (each is read once in an epoch)",
                        validate.Described(
                            f"sample {position.ordinal} of {position.url} (byte {position.offset}) "
                            f"held twice (also by {held[position]})"
                        ),
                    )
                held[position] = key
            if isinstance(stage, ShardReader) and isinstance(parsed, ReaderProgress):
                _check_reader(stage, stages, index, parsed, state, topology)


def _check_reader(
    reader: ShardReader,
    stages: list[Stage],
    index: int,
    progress: ReaderProgress,
    state: PipelineState,
    topology: distributed.Topology,
) -> None:
    """A shard reader's progress must lie within the share of the epoch it was dealt."""
    if reader.resampled:
        if progress.pos >= max(len(reader.urls), 1):
            raise validate.invalid("pos", f"a shard from 0 to {len(reader.urls) - 1}", progress.pos)
        return
    if progress.plan is not None and progress.explicit:
        return  # a stored plan, which its own state checked the progress against
    if reader.custom_split is not None:
        return  # the share is not known here
    if reader.deal.counts is not None or topology.world_size == 1:  # the counts are final
        if progress.counts != reader.deal.counts_digest():
            raise validate.invalid(
                "counts",
                f"{reader.deal.counts_digest()!r}, the digest of this dataset's per-shard sample counts "
                "(the epoch was dealt with other counts: a changed manifest, or counts given differently)",
                progress.counts,
            )
    elif progress.counts is not None:
        return  # the counts come when the epoch starts (and the reader checks them then)
    deal = replace(reader.epoch_deal(stages, index), round_robin=progress.round_robin)
    me, readers = deal.reader_of(topology.rank, topology.world_size, topology.worker, topology.num_workers)
    plan = deal.plan(state.seed, state.epoch, me, readers, topology.world_size)
    counts = reader.deal.counts
    order = deal.order(state.seed, state.epoch)
    progress.check_within(plan, None if counts is None else [counts[shard] for shard in order])


def _without_keys(samples: Iterator, keys: frozenset[str]) -> Iterator:
    """``samples`` without those whose ``__key__`` is one of ``keys``."""
    for sample in samples:
        if not (isinstance(sample, dict) and sample.get("__key__") in keys):
            yield sample


def _all_stages(items: list) -> bool:
    """webdataset splices a list argument into the stages; a list of data items is a source."""
    return all(isinstance(item, Stage) or callable(item) for item in items)
