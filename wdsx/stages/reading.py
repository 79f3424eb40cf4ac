"""The stages that read shards into samples: the source of every pipeline's positions.

:class:`ShardReader` (what ``WebDataset`` builds on) reads the share of each epoch that its
reader was dealt (:class:`~wdsx.read.deal.EpochDeal`); :class:`TarExpander` (webdataset's
``tarfile_to_samples``) reads whatever URLs the stages before it produce. Both keep a
:class:`~wdsx.read.progress.ReaderProgress`: the share's progress and the cursor (byte offset
and ordinal of the next sample) in the shard being read. Resuming opens that shard at that
offset (:mod:`wdsx.read.shard`) instead of re-reading its beginning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import replace
from typing import Any

from wdsx.core import rng
from wdsx.core import topology as distributed
from wdsx.core.errors import Handler, NoSamplesError, StateError, reraise_exception
from wdsx.core.redact import redact_text
from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read import deal as planning
from wdsx.read.fieldsets import FieldJoin, FieldSet
from wdsx.read.npy import epoch_row_seed
from wdsx.read.progress import ReaderProgress, upgrade_plan_v2
from wdsx.read.rows import RowSource
from wdsx.read.samples import POSITION, Cursor, StreamStopped
from wdsx.read.shard import ReadSettings, read_piece, read_positions, stream_offset
from wdsx.sources import SourceOptions
from wdsx.sources.prefetch import Prefetcher
from wdsx.stages.base import Count, RedealTarget, Run, Stage, batch_hint, shards_summary
from wdsx.stages.shardlists import split_by_worker
from wdsx.state.checkpoint import JsonDict, PipelineState
from wdsx.state.position import Position, PositionTable

log = logging.getLogger("wdsx")


def _deliver(
    samples: Iterator[dict[str, Any]], run: Run, handler: Handler, cursor: Cursor
) -> Generator[dict[str, Any], None, bool]:
    """Yield a shard's samples stamped with the run's epoch seed (for ``wdsx.sample_rng``),
    telling the run each one's position (and, for a piece that can hand out whole batches,
    the piece itself: ``run.rows``). A read error goes to the
    handler: True skips the rest of the shard, False ends the stream (returns False); a
    reader whose handler already chose to stop at a bad record ends it too."""
    run.rows = samples if isinstance(samples, RowSource) else None
    seed = run.epoch_seed
    try:
        for sample in samples:
            run.position = sample[POSITION]
            sample[EPOCH_SEED] = seed
            yield sample
    except StreamStopped:
        return False
    except Exception as exn:
        if not handler(exn):
            return False
        cursor.done = True
    finally:
        run.rows = None
    return True


def _warn_if_short(run: Run, url: str, piece: planning.Piece, count: int | None, cursor: Cursor) -> None:
    """In a multi-rank job, a piece the handler cut short (damage it skipped) leaves this rank
    fewer samples than the deal gave every rank: say so, since the ranks may then yield
    different numbers of batches, and a DDP job waits on the rank that ran out."""
    expected = piece.stop if piece.stop is not None else count
    if expected is None or cursor.ordinal >= expected or run.topology.world_size <= 1:
        return
    log.warning(
        "%s: %d of the samples dealt to rank %d were lost to damage the handler skipped; "
        "ranks may now yield different numbers of batches (an endless stream of "
        "resampled shards with the loader's .with_epoch(n) keeps them equal)",
        redact_text(url),
        expected - cursor.ordinal,
        run.topology.rank,
    )


class ShardStage(Stage):
    """A stage that reads shards into positioned samples: the source of a pipeline's
    positions, which it can also read back one by one."""

    produces_samples = True
    reads_shards = True
    state_type = ReaderProgress

    def __init__(self, settings: ReadSettings):
        self.settings = settings

    def read_positions(self, positions: Sequence[Position]) -> list[dict[str, Any]]:
        return read_positions(positions, self.settings)


class ShardReader(ShardStage):
    """Reads this reader's share of every epoch from a fixed shard list.

    Args:
        urls: the expanded shard list (every rank and worker must see the same list).
        settings: how members become samples.
        shuffle: a new random shard order every epoch, from (seed, epoch).
        reader_shuffle: instead, webdataset's seeded shard shuffle: each reader reorders its
            own shards with this function of (positions, seed, epoch) after the split
            (:class:`~wdsx.stages.shuffle.ShardBufferShuffle`).
        resampled: draw shards with replacement, forever (webdataset's ``resampled=True``).
        split_ranks / split_workers: deal the epoch across ranks / DataLoader workers.
        custom_split: webdataset-style node and worker splitter functions applied to the URL
            stream instead of the deal.
        counts: per-URL sample counts (from a manifest or a scan) for balanced splits.
        remainder: how unequal shares are evened out: "exact", "pad" or "drop"; None picks
            "pad" in multi-rank jobs (so every rank yields the same number of batches) and
            "exact" otherwise.
        empty_check: a share of shards that holds no sample at all raises webdataset's
            "No samples found" error (:class:`~wdsx.core.errors.NoSamplesError`).
    """

    state_key = "reader"

    def __init__(
        self,
        urls: Sequence[str],
        settings: ReadSettings,
        *,
        shuffle: bool = False,
        reader_shuffle: Callable[[list[int], int, int], list[int]] | None = None,
        resampled: bool = False,
        split_ranks: bool = True,
        split_workers: bool = True,
        custom_split: tuple[Callable | None, Callable | None] | None = None,
        counts: Sequence[int] | None = None,
        remainder: str | None = None,
        empty_check: bool = False,
    ):
        super().__init__(settings)
        self.deal = planning.EpochDeal(
            tuple(urls), shuffle, None, remainder, split_ranks, split_workers, reader_shuffle=reader_shuffle
        ).with_counts(counts)
        self.resampled = resampled
        self.custom_split = custom_split
        self.empty_check = empty_check
        # (of the URLs as messages show them: a checkpoint holds the fingerprint, and a hash
        # of the whole URLs would let a password be guessed offline against it)
        self._fingerprint = rng.derive_seed("\n".join(map(redact_text, urls)))

    @property
    def urls(self) -> tuple[str, ...]:
        return self.deal.urls

    @property
    def counts(self) -> list[int] | None:
        """Per-shard sample counts, when known (from a manifest, a scan, or given)."""
        return None if self.deal.counts is None else list(self.deal.counts)

    def _mode(self) -> str:
        """How the shards are ordered, as the stage's description names it."""
        if self.resampled:
            return "resampled"
        if self.deal.reader_shuffle is not None:
            return f"shuffled by each reader: {self.deal.reader_shuffle}"
        return "shuffled" if self.deal.shuffle else "ordered"

    def describe(self) -> str:
        return f"shards(n={len(self.urls)}, hash={self._fingerprint:016x}, {self._mode()})"

    def __repr__(self) -> str:
        return f"{shards_summary(self.urls)}, {self._mode()}"

    def epoch_deal(self, stages: Sequence[Stage], index: int) -> planning.EpochDeal:
        """The deal of this reader as stage ``index`` of ``stages`` (whose batching it knows)."""
        if self.custom_split is not None:
            raise StateError(
                "elastic resume is not possible with custom nodesplitter/workersplitter functions"
            )
        return self.deal.with_batching(*batch_hint(stages, index))

    def source_count(self, stages: Sequence[Stage], index: int, run: Run) -> Count | None:
        if self.resampled or self.custom_split is not None:
            return None
        deal = self.epoch_deal(stages, index)
        restore = run.restore
        plan = (
            None
            if restore is None
            else self._redealt_plan(restore.stages.get(run.keys[index]), restore.table())
        )
        if plan is not None:
            # a re-dealt share, whose items are counted from the re-deal (the pipeline's
            # count of items yielded started again there)
            if deal.counts is None:
                return None
            samples = deal.plan_size(run.seed, run.epoch, plan)
            return Count(samples, samples)
        topology = run.topology
        me, readers = deal.reader_of(
            topology.rank, topology.world_size, topology.worker, topology.num_workers
        )
        samples = deal.share_size(run.seed, run.epoch, me, readers, topology.world_size)
        return Count(samples, samples)

    def shard_urls(self) -> Sequence[str]:
        return self.urls

    def redealt(self, saved: JsonDict | None, table: PositionTable) -> bool:
        return self._redealt_plan(saved, table) is not None

    @staticmethod
    def _redealt_plan(saved: JsonDict | None, table: PositionTable) -> planning.ConsumerPlan | None:
        """The plan of a re-dealt share a saved state of this stage reads; None for any other."""
        progress = None if saved is None else ReaderProgress.from_json(saved, table)
        return progress.plan if progress is not None and progress.explicit else None

    def redeal_states(
        self,
        states: Sequence[PipelineState],
        leftovers: Sequence[Position],
        stages: Sequence[Stage],
        index: int,
        readers: RedealTarget,
    ) -> list[PipelineState] | None:
        if self.resampled:
            raise StateError(
                "a checkpoint of resampled shards (resampled=True) resumes only on the number of "
                f"ranks and workers that saved it ({len(states)} reader(s) in all, not "
                f"{readers.readers}): each reader draws from a random stream of its own, so there "
                "is no unread share to deal to other readers"
            )
        return None

    def upgrade_state(self, saved: JsonDict, table: PositionTable) -> JsonDict:
        return upgrade_plan_v2(saved, list(self.urls), table)

    # --- reading ----------------------------------------------------------------------
    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        progress, restored = run.attach(index, ReaderProgress)
        if self.resampled:
            return self._resampled(run, progress)
        if self.custom_split is not None:
            order = self._custom_order(run)
            plan = planning.ConsumerPlan([planning.Span(0, 0, len(order), 0, 0)])
        else:
            deal = self.epoch_deal(run.stages, index)
            if restored and not progress.explicit:
                deal.check_counts(progress.counts)
                deal = replace(deal, round_robin=progress.round_robin)
            order = deal.order(run.seed, run.epoch)
            topology = run.topology
            me, readers = deal.reader_of(
                topology.rank, topology.world_size, topology.worker, topology.num_workers
            )
            plan = deal.plan(run.seed, run.epoch, me, readers, topology.world_size)
        progress.counts = self.deal.counts_digest()
        if progress.plan is None:
            progress.plan = plan
        return self._planned(run, progress, progress.plan, order, restored)

    def _custom_order(self, run: Run) -> list[int]:
        node_split, worker_split = self.custom_split or (None, None)
        if worker_split not in (None, split_by_worker) and distributed.in_reader_thread():
            # torch keeps one worker info per process, and has none for a thread: a splitter
            # that asks it would give every thread every shard
            raise ValueError(
                "a WebLoader thread worker cannot run a WebDataset's own workersplitter function "
                "(one written for webdataset asks torch which worker it runs in, and torch has no "
                "answer in a thread); use wdsx's split_by_worker (the default), or worker processes"
            )
        index = {url: i for i, url in enumerate(self.urls)}
        order = self.deal.order(run.seed, run.epoch)
        stream: Iterator = iter({"url": self.urls[i]} for i in order)
        if node_split is not None:
            stream = node_split(stream)
        if worker_split is not None:
            stream = worker_split(stream)
        mine = [index[item["url"]] for item in stream]
        reorder = self.deal.reader_shuffle
        return mine if reorder is None else reorder(mine, run.seed, run.epoch)

    def _planned(
        self,
        run: Run,
        progress: ReaderProgress,
        plan: planning.ConsumerPlan,
        order: list[int],
        restored: bool,
    ) -> Iterator:
        settings, handler, urls = self.settings, self.settings.handler, self.urls
        # Rows of .npy shards are read in an order that changes with the shard order.
        row_seed = epoch_row_seed(run.seed, run.epoch) if self.deal.shuffle else None
        while progress.leftover < len(plan.leftovers):
            sample = read_positions([plan.leftovers[progress.leftover]], settings)[0]
            sample[EPOCH_SEED] = run.epoch_seed
            progress.leftover += 1
            run.position = sample[POSITION]
            yield sample
        work = _remaining_work(plan, progress, restored)
        counts = self.deal.counts
        # Without counts, a share that yields nothing at all is the loss webdataset reports
        # (with counts, read_piece already checks each shard).
        nothing = self.empty_check and counts is None and not restored and not plan.leftovers
        with Prefetcher(settings.options) as prefetcher:
            for number, (span_index, piece, cursor) in enumerate(work):
                for _, ahead, _ in work[number + 1 : number + 1 + settings.options.prefetch]:
                    if ahead.offset is not None:
                        ahead_url = urls[order[ahead.pos]]
                        offset = stream_offset(ahead_url, ahead.offset)
                        sha256, size = settings.expected_hash(ahead_url), settings.expected_size(ahead_url)
                        prefetcher.schedule(ahead_url, offset, sha256, size)
                progress.span, progress.pos, progress.cursor = span_index, piece.pos, cursor
                extra = {"__pad__": True} if piece.pad else None
                url, count = urls[order[piece.pos]], None if counts is None else counts[order[piece.pos]]
                samples = read_piece(
                    url, cursor, piece.stop, settings, extra, prefetcher, count, row_seed=row_seed
                )
                if not (yield from _deliver(samples, run, handler, cursor)):
                    progress.done = True
                    return
                _warn_if_short(run, url, piece, count, cursor)
                nothing = nothing and cursor.ordinal <= piece.first
        if nothing and work:
            raise NoSamplesError([urls[order[piece.pos]] for _, piece, _ in work])
        progress.span = len(plan.spans)
        progress.done = True

    def _resampled(self, run: Run, progress: ReaderProgress) -> Iterator:
        """Shards drawn with replacement from a per-reader random stream, without end."""
        topology = run.topology
        me, _ = self.deal.reader_of(topology.rank, topology.world_size, topology.worker, topology.num_workers)
        seed = rng.derive_seed("resample", run.seed, me)
        if not self.urls:
            return
        while True:
            if progress.draws == 0 or progress.cursor.done:
                shard = rng.below(seed, progress.draws, len(self.urls))
                progress.draws += 1
                progress.pos = shard
                progress.cursor = Cursor(0, 0)
            cursor = progress.cursor
            samples = read_piece(self.urls[progress.pos], cursor, None, self.settings)
            if not (yield from _deliver(samples, run, self.settings.handler, cursor)):
                return


def _remaining_work(
    plan: planning.ConsumerPlan, progress: ReaderProgress, restored: bool
) -> list[tuple[int, planning.Piece, Cursor]]:
    """The pieces still to read, each with the cursor to start it from (a restored
    checkpoint's cursor for the piece it was in)."""
    work = []
    for span_index in range(progress.span, len(plan.spans)):
        for piece in planning.pieces(plan.spans[span_index]):
            if restored and span_index == progress.span:
                if piece.pos < progress.pos or (piece.pos == progress.pos and progress.cursor.done):
                    continue
                if piece.pos == progress.pos:
                    work.append((span_index, piece, progress.cursor))
                    continue
            work.append((span_index, piece, Cursor(piece.offset, piece.first)))
    return work


class TarExpander(ShardStage):
    """webdataset's ``tarfile_to_samples``: URL dicts in, samples out, with a cursor."""

    state_key = "expander"

    def describe(self) -> str:
        return "tarfile_to_samples"

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return self._expand(upstream, run, run.attach(index, ReaderProgress)[0])

    def _expand(self, upstream: Iterator, run: Run, progress: ReaderProgress) -> Iterator:
        settings, handler = self.settings, self.settings.handler
        resume = progress.taken
        for number, item in enumerate(upstream):
            if number < resume - 1 or (number == resume - 1 and progress.cursor.done):
                continue
            if number == resume - 1:
                cursor = progress.cursor
            else:
                cursor = Cursor(0, 0)
                progress.taken, progress.cursor = number + 1, cursor
            url = item["url"] if isinstance(item, dict) else item
            if not (yield from _deliver(read_piece(url, cursor, None, settings), run, handler, cursor)):
                return
        progress.done = True


def tarfile_to_samples(
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
    options: SourceOptions | None = None,
    *,
    fields: str | FieldSet | Sequence[str | FieldSet] = (),
    missing_fields: str = "error",
    overwrite_fields: bool = False,
) -> TarExpander:
    """The stage that turns ``{"url": ...}`` items into samples (webdataset's name).

    ``fields``, ``missing_fields`` and ``overwrite_fields`` join field sets to the samples by
    key, as for :class:`~wdsx.WebDataset` (see :mod:`wdsx.read.fieldsets`)."""
    options = options or SourceOptions()
    join = FieldJoin.load(fields, missing_fields, overwrite_fields, options) if fields else None
    return TarExpander(ReadSettings(options, handler, select_files, rename_files, fields=join))


def tarfile_samples(
    src: Iterator,
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples from an iterator of ``{"url": ...}`` items."""
    return tarfile_to_samples(handler, select_files, rename_files)(src)
