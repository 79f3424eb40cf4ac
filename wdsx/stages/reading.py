"""Reading shards into samples, starting anywhere: the source stage of every pipeline.

:class:`ShardReader` (what ``WebDataset`` builds on) reads the spans its consumer was dealt
(:mod:`wdsx.read.deal`); :class:`TarExpander` (webdataset's ``tarfile_to_samples``) reads whatever
URLs the stages before it produce. Both keep a cursor: the shard, byte offset and ordinal of
the next sample. A checkpoint stores that cursor, and resuming opens the shard at that offset
(a seek, or a ranged request) instead of re-reading the shard's beginning.

Compressed shards (gzip, bzip2, xz) cannot start at an offset: they are re-read from the start and the
decompressed bytes before the offset are skipped (logged once per shard).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from wdsx.core import rng
from wdsx.core.compression import named_compressed, uncompressed
from wdsx.core.errors import Handler, ShardError, StateError, reraise_exception
from wdsx.core.streams import Prefixed
from wdsx.read import deal as planning
from wdsx.read.samples import POSITION, Cursor, group_members, sample_starts
from wdsx.read.tar import BLOCK, iter_members, looks_like_header, read_exact, scan_headers
from wdsx.sources import SourceOptions, open_source, scheme_of
from wdsx.sources.prefetch import Prefetcher
from wdsx.stages.base import Run, Stage

log = logging.getLogger("wdsx")


@dataclass
class ReadSettings:
    """How members become samples, shared by the reading stages (picklable)."""

    options: SourceOptions
    handler: Handler = reraise_exception
    select_files: Callable[[str], bool] | None = None
    rename_files: Callable[[str], str] | None = None
    add_local_path: bool = False
    sha256: dict[str, str] | None = None
    """Expected SHA-256 per URL (from a manifest), checked when shards go through the cache."""

    def expected_hash(self, url: str) -> str | None:
        return self.sha256.get(url) if self.sha256 else None


def stream_offset(url: str, offset: int) -> int:
    """Where a shard's byte stream must be opened to reach tar offset ``offset``."""
    return 0 if named_compressed(url) else offset


class _TarStream:
    """The tar byte stream of one shard, possibly compressed, starting at a tar offset.

    A shard is taken as compressed when its name says so or when its first bytes do; one that
    is compressed without saying so is found out when the bytes at a resume offset are not a
    tar header, and is then re-read from its start.
    """

    def __init__(self, url: str, offset: int, settings: ReadSettings, prefetcher: Prefetcher | None = None):
        opened_at = stream_offset(url, offset)
        sha256 = settings.expected_hash(url)
        if prefetcher is not None:
            self.source = prefetcher.open(url, opened_at, sha256)
        else:
            self.source = open_source(url, opened_at, settings.options, sha256=sha256)
        try:
            self._position(url, offset, opened_at, settings)
        except BaseException:
            self.source.close()
            raise

    def _position(self, url: str, offset: int, opened_at: int, settings: ReadSettings) -> None:
        self.local_path = self.source.local_path
        if opened_at:
            head = read_exact(self.source.read, BLOCK)
            if looks_like_header(head):
                stream: Any = Prefixed(head, self.source.read, self.source.readinto)
                self.read, self.readinto = stream.read, stream.readinto
                return
            self.source.close()
            self.source = open_source(url, 0, settings.options, sha256=settings.expected_hash(url))
        stream, compressed = uncompressed(self.source.read, self.source.readinto)
        self.read, self.readinto = stream.read, stream.readinto
        if offset and not compressed:
            raise ShardError(url, offset, "no tar header at the resume offset (was the shard rewritten?)")
        if offset:
            log.info("%s is compressed: reading it from the start to reach offset %d", url, offset)
            remaining = offset
            while remaining > 0:
                skipped = len(self.read(min(remaining, 1 << 20)))
                if not skipped:
                    raise ShardError(url, offset, "compressed shard ends before the resume offset")
                remaining -= skipped

    def close(self) -> None:
        self.source.close()


def read_piece(
    url: str,
    cursor: Cursor,
    stop: int | None,
    settings: ReadSettings,
    extra: dict[str, Any] | None = None,
    prefetcher: Prefetcher | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples of one shard from ``cursor`` (offset and ordinal) up to ordinal ``stop``.

    A cursor whose offset is None starts at its ordinal: local shards find it by scanning
    headers, other shards are read from the start and the samples before it skipped.
    ``prefetcher`` hands over the shard if it was opened ahead of time.
    """
    offset, first = cursor.offset, cursor.ordinal
    if offset is None:
        offset = _locate(url, first, settings)
        if offset is not None:
            cursor.offset = offset
    stream = _TarStream(url, offset or 0, settings, prefetcher)
    pad = bool(extra and extra.get("__pad__"))
    try:
        if settings.add_local_path and stream.local_path is not None:
            extra = {**(extra or {}), "__local_path__": stream.local_path}
        if offset is None:
            cursor.offset, cursor.ordinal = 0, 0
        members = iter_members(stream, url, offset or 0, settings.options.chunk)
        failure: list[Exception] = []
        if settings.handler is not reraise_exception:
            members = _until_error(members, failure)
        samples = group_members(
            members,
            url,
            cursor,
            stop=stop,
            rename_files=settings.rename_files,
            select_files=settings.select_files,
            extra=extra,
        )
        if offset is None or pad:
            for sample in samples:
                if offset is None and sample[POSITION][2] < first:
                    continue
                if pad:
                    sample[POSITION] += (True,)
                yield sample
        else:
            yield from samples
        if failure:
            raise failure[0]
    finally:
        stream.close()


def _until_error(members: Iterator, failure: list[Exception]) -> Iterator:
    """Pass members through; on a read error, end the stream and keep the error, so that the
    sample being grouped is still delivered before the error reaches a continuing handler."""
    try:
        yield from members
    except Exception as exn:
        failure.append(exn)


def _locate(url: str, ordinal: int, settings: ReadSettings) -> int | None:
    """Byte offset of sample ``ordinal`` in a local, uncompressed shard, found by a header
    scan that seeks over payloads; None when the shard is remote or compressed (the caller
    then reads from the start and skips)."""
    if ordinal == 0:
        return 0
    if named_compressed(url):
        return None
    with open_source(url, 0, settings.options) as source:
        stream, compressed = uncompressed(source.read)
        if source.local_path is None or compressed:
            return None
        headers = scan_headers(stream.read, source.skip, url)
        for found, offset in sample_starts(headers, settings.rename_files, settings.select_files):
            if found == ordinal:
                return offset
    raise ShardError(url, None, f"shard has fewer than {ordinal + 1} samples")


def read_positions(positions: Sequence[tuple], settings: ReadSettings) -> list[dict[str, Any]]:
    """Read the samples at ``positions`` (``(url, offset, ordinal[, pad])``), in that order.

    Positions in one shard are read in one forward pass, reopening the shard only to jump
    a long gap, so refilling a large buffer costs about one read per shard, not per sample.
    """
    wanted: dict[str, list[tuple[int, int, bool, int]]] = {}
    for index, position in enumerate(positions):
        pad = len(position) > 3 and bool(position[3])
        wanted.setdefault(position[0], []).append((position[1], position[2], pad, index))
    samples: list[Any] = [None] * len(positions)
    for url, targets in wanted.items():
        targets.sort()
        gap = settings.options.chunk * (1 if scheme_of(url) == "file" else 8)
        next_target = 0
        while next_target < len(targets):
            offset, ordinal = targets[next_target][:2]
            progressed = False
            with closing(read_piece(url, Cursor(offset, ordinal), None, settings)) as shard:
                for sample in shard:
                    found = sample[POSITION][1]
                    if found > targets[next_target][0]:
                        break  # no sample started at the wanted offset
                    while next_target < len(targets) and targets[next_target][0] == found:
                        pad, index = targets[next_target][2:]
                        samples[index] = _as_padding(sample) if pad else dict(sample)
                        next_target += 1
                        progressed = True
                    if next_target == len(targets) or targets[next_target][0] - found > gap:
                        break
            if not progressed:
                raise ShardError(url, offset, "no sample starts at this offset (restoring a buffer)")
    return samples


def _as_padding(sample: dict[str, Any]) -> dict[str, Any]:
    """A copy of a sample marked as read a second time to even out shares."""
    url, offset, ordinal = sample[POSITION][:3]
    return {**sample, "__pad__": True, POSITION: (url, offset, ordinal, True)}


class _Progress:
    """A reading stage's cursor, as a checkpoint sees it."""

    __slots__ = (
        "plan",
        "explicit",
        "restored",
        "counts",
        "span",
        "pos",
        "cursor",
        "leftover",
        "draws",
        "taken",
        "done",
    )

    def __init__(self) -> None:
        self.plan: planning.ConsumerPlan | None = None
        self.restored = False
        self.counts: str | None = None  # digest of the sample counts the plan was made with
        self.explicit = False  # the plan came from a checkpoint (re-dealt), not from the epoch
        self.span = 0
        self.pos = 0
        self.cursor = Cursor(0, 0)
        self.leftover = 0
        self.draws = 0
        self.taken = 0
        self.done = False

    def snapshot(self, table: Any) -> dict:
        state: dict[str, Any] = {
            "span": self.span,
            "pos": self.pos,
            "offset": self.cursor.offset,
            "ordinal": self.cursor.ordinal,
            "piece_done": self.cursor.done,
            "leftover": self.leftover,
            "draws": self.draws,
            "taken": self.taken,
            "done": self.done,
            "counts": self.counts,
        }
        if self.explicit and self.plan is not None:
            state["plan"] = self.plan.to_json()
        return state

    @classmethod
    def attach(cls, run: Run, index: int) -> _Progress:
        """A cursor registered with ``run``, restored from its checkpoint if it has one."""
        progress = cls()
        saved = run.register(index, progress)
        if saved is not None:
            progress.restore(saved)
        return progress

    def restore(self, saved: dict) -> None:
        self.restored = True
        self.span, self.pos = saved["span"], saved["pos"]
        self.cursor = Cursor(saved["offset"], saved["ordinal"])
        self.cursor.done = saved["piece_done"]
        self.leftover, self.draws, self.taken = saved["leftover"], saved["draws"], saved["taken"]
        self.counts = saved.get("counts")
        self.done = saved["done"]
        if "plan" in saved:
            self.plan = planning.ConsumerPlan.from_json(saved["plan"])
            self.explicit = True


def _deliver(samples: Iterator[dict[str, Any]], run: Run, handler: Handler, cursor: Cursor) -> Generator:
    """Yield a shard's samples, telling the run each one's position. A read error goes to
    the handler: True skips the rest of the shard, False ends the stream (returns False)."""
    try:
        for sample in samples:
            run.position = sample[POSITION]
            yield sample
    except Exception as exn:
        if not handler(exn):
            return False
        cursor.done = True
    return True


class ShardStage(Stage):
    """A stage that reads shards into positioned samples: the source of a pipeline's
    positions, which it can also read back one by one."""

    produces_samples = True

    def __init__(self, settings: ReadSettings):
        self.settings = settings

    def read_positions(self, positions: Sequence[tuple]) -> list[dict[str, Any]]:
        return read_positions(positions, self.settings)


class ShardReader(ShardStage):
    """Reads this consumer's share of every epoch from a fixed shard list.

    Args:
        urls: the expanded shard list (every rank and worker must see the same list).
        settings: how members become samples.
        shuffle: a new random shard order every epoch, from (seed, epoch).
        resampled: draw shards with replacement, forever (webdataset's ``resampled=True``).
        split_ranks / split_workers: deal the epoch across ranks / DataLoader workers.
        custom_split: webdataset-style node and worker splitter functions applied to the URL
            stream instead of the planner.
        counts: per-URL sample counts (from a manifest or a scan) for balanced splits.
        remainder: how unequal shares are evened out: "exact", "pad" or "drop"; None picks
            "pad" in multi-rank jobs (so every rank yields the same number of batches) and
            "exact" otherwise.
    """

    def __init__(
        self,
        urls: Sequence[str],
        settings: ReadSettings,
        *,
        shuffle: bool = False,
        resampled: bool = False,
        split_ranks: bool = True,
        split_workers: bool = True,
        custom_split: tuple[Callable | None, Callable | None] | None = None,
        counts: Sequence[int] | None = None,
        remainder: str | None = None,
    ):
        super().__init__(settings)
        self.urls = list(urls)
        self.shuffle = shuffle
        self.resampled = resampled
        self.split_ranks = split_ranks
        self.split_workers = split_workers
        self.custom_split = custom_split
        self.counts = list(counts) if counts is not None else None
        self.remainder = remainder
        self._fingerprint = rng.derive_seed("\n".join(self.urls))

    def describe(self) -> str:
        mode = "resampled" if self.resampled else ("shuffled" if self.shuffle else "ordered")
        return f"shards(n={len(self.urls)}, hash={self._fingerprint:016x}, {mode})"

    # --- planning ---------------------------------------------------------------------
    def consumers(self, run: Run) -> tuple[int, int]:
        """(this consumer's index, number of consumers) under the configured splitting."""
        topo = run.topology
        ranks = topo.world_size if self.split_ranks else 1
        workers = topo.num_workers if self.split_workers else 1
        rank = topo.rank if self.split_ranks else 0
        worker = topo.worker if self.split_workers else 0
        return rank * workers + worker, ranks * workers

    def remainder_for(self, world_size: int) -> str:
        if self.remainder is not None:
            return self.remainder
        return "pad" if world_size > 1 and self.split_ranks else "exact"

    def counts_digest(self) -> str | None:
        """A short fingerprint of the per-shard sample counts (plans depend on them)."""
        return None if self.counts is None else f"{rng.derive_seed(*self.counts):016x}"

    def check_counts(self, saved: str | None) -> None:
        """Refuse to rebuild a checkpoint's plan from other sample counts than it was made with."""
        if saved != self.counts_digest():
            raise StateError(
                "the checkpoint's epoch was dealt with other per-shard sample counts than this "
                "dataset has now (a changed manifest, or counts given differently)"
            )

    def counts_in_order(self, order: Sequence[int]) -> list[int] | None:
        return [self.counts[i] for i in order] if self.counts is not None else None

    def plan_for(self, run: Run, index: int) -> tuple[list[int], planning.ConsumerPlan]:
        """This consumer's shard order and plan for the run's epoch."""
        if self.custom_split is not None:
            order = self._custom_order(run)
            return order, planning.ConsumerPlan([planning.Span(0, 0, len(order), 0, 0)])
        order = planning.epoch_order(len(self.urls), run.seed, run.epoch, self.shuffle)
        me, consumers = self.consumers(run)
        plan = self.plan_consumer(
            order, me, consumers, batch_hint(run.stages, index), run.topology.world_size
        )
        return order, plan

    def plan_consumer(
        self, order: Sequence[int], consumer: int, consumers: int, hint: tuple[int, bool], world_size: int
    ) -> planning.ConsumerPlan:
        """The plan of one consumer among ``consumers`` for an epoch with shard ``order``."""
        batch, partial = hint
        counts = self.counts_in_order(order)
        remainder = self.remainder_for(world_size)
        return planning.plan_epoch(consumers, counts, len(order), batch, partial, remainder)[consumer]

    def _custom_order(self, run: Run) -> list[int]:
        node_split, worker_split = self.custom_split or (None, None)
        index = {url: i for i, url in enumerate(self.urls)}
        order = planning.epoch_order(len(self.urls), run.seed, run.epoch, self.shuffle)
        stream: Iterator = iter({"url": self.urls[i]} for i in order)
        if node_split is not None:
            stream = node_split(stream)
        if worker_split is not None:
            stream = worker_split(stream)
        return [index[item["url"]] for item in stream]

    # --- reading ----------------------------------------------------------------------
    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        progress = _Progress.attach(run, index)
        if self.resampled:
            return self._resampled(run, progress)
        if progress.restored and not progress.explicit:
            self.check_counts(progress.counts)
        progress.counts = self.counts_digest()
        order, plan = self.plan_for(run, index)
        if progress.plan is None:
            progress.plan = plan
        return self._planned(run, progress, order)

    def _planned(self, run: Run, progress: _Progress, order: list[int]) -> Iterator:
        settings, handler, urls = self.settings, self.settings.handler, self.urls
        plan = progress.plan
        while progress.leftover < len(plan.leftovers):
            (shard, offset, ordinal), pad = plan.leftovers[progress.leftover]
            sample = read_positions([(urls[shard], offset, ordinal, pad)], settings)[0]
            progress.leftover += 1
            run.position = sample[POSITION]
            yield sample
        work = self._remaining_work(plan, progress)
        with Prefetcher(settings.options) as prefetcher:
            for number, (span_index, piece, cursor) in enumerate(work):
                for _, ahead, _ in work[number + 1 : number + 1 + settings.options.prefetch]:
                    if ahead.offset is not None:
                        ahead_url = urls[order[ahead.pos]]
                        offset = stream_offset(ahead_url, ahead.offset)
                        prefetcher.schedule(ahead_url, offset, settings.expected_hash(ahead_url))
                progress.span, progress.pos, progress.cursor = span_index, piece.pos, cursor
                extra = {"__pad__": True} if piece.pad else None
                samples = read_piece(urls[order[piece.pos]], cursor, piece.stop, settings, extra, prefetcher)
                if not (yield from _deliver(samples, run, handler, cursor)):
                    progress.done = True
                    return
        progress.span = len(plan.spans)
        progress.done = True

    @staticmethod
    def _remaining_work(
        plan: planning.ConsumerPlan, progress: _Progress
    ) -> list[tuple[int, planning.Piece, Cursor]]:
        """The pieces still to read, each with the cursor to start it from (a restored
        checkpoint's cursor for the piece it was in)."""
        work = []
        for span_index in range(progress.span, len(plan.spans)):
            for piece in planning.pieces(plan.spans[span_index]):
                if progress.restored and span_index == progress.span:
                    if piece.pos < progress.pos or (piece.pos == progress.pos and progress.cursor.done):
                        continue
                    if piece.pos == progress.pos:
                        work.append((span_index, piece, progress.cursor))
                        continue
                work.append((span_index, piece, Cursor(piece.offset, piece.first)))
        return work

    def _resampled(self, run: Run, progress: _Progress) -> Iterator:
        """Shards drawn with replacement from a per-consumer random stream, without end."""
        me, _ = self.consumers(run)
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


def batch_hint(stages: Sequence[Stage], index: int) -> tuple[int, bool]:
    """Batch size and partial flag of the first batching stage after stage ``index``, so that
    dealt shares can give every consumer the same number of batches."""
    for stage in stages[index + 1 :]:
        hint = getattr(stage, "batch_hint", None)
        if hint is not None:
            return hint
        if getattr(stage, "ends_batching", False):
            break
    return 1, True


class TarExpander(ShardStage):
    """webdataset's ``tarfile_to_samples``: URL dicts in, samples out, with a cursor."""

    def describe(self) -> str:
        return "tarfile_to_samples"

    def apply(self, upstream: Iterator | None, run: Run, index: int) -> Iterator:
        return self._expand(upstream, run, _Progress.attach(run, index))

    def _expand(self, upstream: Iterator, run: Run, progress: _Progress) -> Iterator:
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
) -> TarExpander:
    """The stage that turns ``{"url": ...}`` items into samples (webdataset's name)."""
    return TarExpander(ReadSettings(options or SourceOptions(), handler, select_files, rename_files))


def tarfile_samples(
    src: Iterator,
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples from an iterator of ``{"url": ...}`` items."""
    return tarfile_to_samples(handler, select_files, rename_files)(src)
