"""WebDataset: the fluent, webdataset-compatible entry point.

``WebDataset(urls, ...)`` takes webdataset's constructor arguments and builds a pipeline whose
first stage is a :class:`~wdsx.stages.reading.ShardReader`. Where webdataset's behaviour is a known
trap, wdsx differs (see the manual's "Differences from webdataset"): an unseeded shard shuffle
gives a new order every epoch, multi-rank jobs split by rank without an explicit
nodesplitter, fewer shards than workers is fine, every rank can be given the same number of
batches, and missing local shards are reported when the dataset is built, not when a reader
reaches them.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import posixpath
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from wdsx.core import topology as distributed
from wdsx.core.errors import Handler, MissingShardError, reraise_exception
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.read.fieldsets import FieldJoin, FieldSet
from wdsx.read.npy import header_counts
from wdsx.read.shard import ReadSettings
from wdsx.sources import SourceOptions, missing_local_shards, scheme_of
from wdsx.sources.listing import expand_urls
from wdsx.sources.urls import without_query
from wdsx.stages import shardlists
from wdsx.stages.reading import ShardReader, tarfile_to_samples
from wdsx.stages.shardlists import single_node_only, split_by_node, split_by_worker
from wdsx.stages.shuffle import ShardBufferShuffle
from wdsx.stages.shuffle import detshuffle as detshuffle_stage
from wdsx.stages.shuffle import shuffle as shuffle_stage

log = logging.getLogger("wdsx")


def _file_selector(select_files: Callable[[str], bool] | str | None) -> Callable[[str], bool] | None:
    """Accept a predicate or, as webdataset's FAQ suggests, a glob string (``"*.jpg"``)."""
    if isinstance(select_files, str):
        patterns = select_files.split(";")
        return lambda name: any(fnmatch.fnmatch(name, pattern) for pattern in patterns)
    return select_files


def _source_options(options: SourceOptions | None, cache_dir: str | None, cache_size: int) -> SourceOptions:
    options = options or SourceOptions()
    if cache_dir is not None:
        options = replace(options, cache_dir=cache_dir, cache_size=cache_size)
    return options


def _beside(url: str, manifest_url: str | None) -> bool:
    """Whether ``url`` names a shard in the manifest's directory (a manifest given as an
    object, without a URL, describes every shard)."""
    if manifest_url is None:
        return True
    if scheme_of(url) == "file" and scheme_of(manifest_url) == "file":
        return os.path.dirname(os.path.abspath(url)) == os.path.dirname(os.path.abspath(manifest_url))
    return posixpath.dirname(without_query(url)) == posixpath.dirname(without_query(manifest_url))


_SHOWN_MISSING = 3
"""How many missing shards an error names before saying how many more there are."""


def _check_local_shards(urls: Sequence[str], handler: Handler) -> None:
    """Give ``handler`` one :class:`SourceError` listing the local shards of ``urls`` that do
    not exist, before anything is read: a typo at the end of a brace range shows at once, not
    after an epoch. A handler that continues has the missing shards skipped when they are read."""
    local = list(dict.fromkeys(url for url in urls if scheme_of(url) == "file"))
    missing = missing_local_shards(local)
    if not missing:
        return
    shown = ", ".join(missing[:_SHOWN_MISSING])
    if len(missing) > _SHOWN_MISSING:
        shown += f" and {len(missing) - _SHOWN_MISSING} more"
    handler(
        MissingShardError(missing[0], f"{len(missing)} of {len(local)} local shards do not exist: {shown}")
    )


def _splitting(nodesplitter: Any, workersplitter: Any) -> tuple[bool, bool, tuple | None]:
    """Map webdataset's splitter arguments onto the planner: wdsx's own splitters (the
    defaults) let the planner deal the epoch; None means no splitting at that level; any
    other function is applied to the URL stream as in webdataset."""
    known_node = nodesplitter in (split_by_node, single_node_only, None)
    known_worker = workersplitter in (split_by_worker, None)
    if known_node and known_worker:
        return nodesplitter is not None, workersplitter is not None, None
    return False, False, (nodesplitter, workersplitter)


def _given(value: Any) -> bool:
    """Whether an optional argument was given a value (not None, a false flag or number, or
    an empty list)."""
    if isinstance(value, (list, tuple)):
        return len(value) > 0
    if isinstance(value, (bool, int)):
        return bool(value)
    return value is not None


def _order_seed(seed: int | str | None) -> int | str | None:
    """The seed webdataset's shard order is a function of: the one given, else ``$WDS_SEED``
    (as text, as webdataset reads it); None when webdataset picks one at random."""
    return seed if seed is not None else os.environ.get("WDS_SEED")


def _seeded_shard_shuffle(args: SimpleNamespace) -> ShardBufferShuffle | None:
    """With a seed (given, or ``$WDS_SEED``: the pipeline's seed then), webdataset's shard
    order is a function of it: each reader buffer-shuffles its own shards, through a buffer
    of ``args.shardshuffle`` (as webdataset reads it). Without one, webdataset's order is
    random, and wdsx shuffles the whole list anew every epoch."""
    order_seed = _order_seed(args.seed)
    if not args.shardshuffle or args.resampled or order_seed is None:
        return None
    text = order_seed if isinstance(order_seed, str) else None
    return ShardBufferShuffle(int(args.shardshuffle), args.detshuffle, text)


class WebDataset(DataPipeline):
    """Samples from WebDataset tar shards, with webdataset's arguments plus:

    Args:
        manifest: per-shard sample counts for balanced splitting: None looks for the manifest
            written by ShardWriter / ``wdsx convert`` beside the shards; a URL or a
            :class:`~wdsx.read.manifest.Manifest` uses that one; False never looks.
        counts: per-shard sample counts given directly, or ``"scan"`` to count local shards
            by reading their headers.
        remainder: ``"exact"``, ``"pad"`` or ``"drop"``: how the epoch is evened out across
            readers (see :func:`wdsx.read.deal.consumer_lengths`); default ``"pad"`` for multi-rank
            jobs, ``"exact"`` otherwise.
        options: how shards are fetched (timeouts, retries, S3 client settings, cache).
        index_sizes: give every sample ``"__sizes__"``, its image widths and heights and list
            lengths as ``wdsx index --sizes`` recorded them in the shard's offset index (for a
            bucketing key that needs no decoding; see :mod:`wdsx.read.sizes`).
        fields: field sets (their directories or manifest URLs) whose fields are added to every
            sample, matched by key (see :mod:`wdsx.read.fieldsets`).
        missing_fields: ``"error"`` (a base sample without an entry in a field set is an
            error) or ``"skip"`` (such samples are dropped).
        overwrite_fields: let a field set replace a field the sample already has.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        handler: Handler = reraise_exception,
        mode: str | None = None,
        resampled: bool = False,
        repeat: bool = False,
        shardshuffle: bool | int | None = None,
        cache_size: int = -1,
        cache_dir: str | None = None,
        url_to_name: Any = None,
        detshuffle: bool = False,
        nodesplitter: Callable | None = split_by_node,
        workersplitter: Callable | None = split_by_worker,
        select_files: Callable[[str], bool] | str | None = None,
        rename_files: Callable[[str], str] | None = None,
        empty_check: bool = True,
        verbose: bool = False,
        seed: int | str | None = None,
        *,
        manifest: Any = None,
        counts: Sequence[int] | str | None = None,
        remainder: str | None = None,
        options: SourceOptions | None = None,
        index_sizes: bool = False,
        fields: str | FieldSet | Sequence[str | FieldSet] = (),
        missing_fields: str = "error",
        overwrite_fields: bool = False,
    ):
        super().__init__(seed=seed)
        resampled = resampled or mode == "resampled"
        args = SimpleNamespace(  # what webdataset hands its hooks
            urls=urls,
            handler=handler,
            mode="resampled" if resampled else mode,
            resampled=resampled,
            repeat=repeat,
            shardshuffle=100 if shardshuffle is True else shardshuffle,
            cache_size=cache_size,
            cache_dir=cache_dir,
            url_to_name=url_to_name,
            detshuffle=detshuffle,
            nodesplitter=nodesplitter,
            workersplitter=workersplitter,
            select_files=select_files,
            rename_files=rename_files,
            empty_check=empty_check,
            verbose=verbose,
            seed=seed,
        )
        self.update_cache_info(args)
        self.options = _source_options(options, args.cache_dir, args.cache_size)
        if type(self).create_url_iterator is not WebDataset.create_url_iterator:
            planner = dict(
                manifest=manifest, counts=counts, remainder=remainder, index_sizes=index_sizes, fields=fields
            )
            self._build_as_webdataset(args, [name for name, value in planner.items() if _given(value)])
            return
        if isinstance(urls, dict) or (isinstance(urls, str) and urls.endswith((".yaml", ".yml"))):
            raise ValueError(
                "WebDataset reads a fixed shard list; for a YAML dataset spec, whose shards change "
                "every epoch, build the pipeline from it: DataPipeline(MultiShardSample(spec), "
                "split_by_worker, tarfile_to_samples(), ...)"
            )
        self.urls = expand_urls(urls, self.options)
        if empty_check and not self.urls:
            raise ValueError(f"WebDataset: no shards in {urls!r}")
        _check_local_shards(self.urls, handler)
        if nodesplitter is single_node_only:
            single_node_only(iter(()))
        split_ranks, split_workers, custom = _splitting(nodesplitter, workersplitter)
        self.manifest, manifest_url = self._find_manifest(manifest)
        described = [url for url in self.urls if self.manifest and _beside(url, manifest_url)]
        entries = {url: self.manifest.entry_for(url) for url in described} if self.manifest else {}
        settings = self._settings = ReadSettings(
            self.options,
            handler,
            _file_selector(select_files),
            rename_files,
            True,
            sha256={url: entry.sha256 for url, entry in entries.items() if entry and entry.sha256},
            sizes={url: entry.bytes for url, entry in entries.items() if entry},
            index_sizes=index_sizes,
            fields=FieldJoin.load(fields, missing_fields, overwrite_fields, self.options) if fields else None,
        )
        # Counts from a manifest hold for the shards beside it, grouped without renaming or
        # selecting members; otherwise they are counted (or left unknown).
        self._manifest_counts = len(described) == len(self.urls) and not (select_files or rename_files)
        self.reader: ShardReader | None = ShardReader(
            self.urls,
            settings,
            shuffle=bool(shardshuffle) and not resampled,
            reader_shuffle=_seeded_shard_shuffle(args),
            resampled=resampled,
            split_ranks=split_ranks,
            split_workers=split_workers,
            custom_split=custom,
            counts=self._initial_counts(counts),
            remainder=remainder,
            empty_check=empty_check,
        )
        self.append(self.reader)
        if repeat:
            self.repeat()

    # --- webdataset's hooks for subclasses ---------------------------------------------
    def update_cache_info(self, args: SimpleNamespace) -> None:
        """webdataset's hook: set ``args.cache_dir`` and ``args.cache_size`` from ``WDS_CACHE``
        and ``WDS_CACHE_SIZE`` when they are set (a subclass may override it). A cache
        directory that does not exist yet is created when first used."""
        args.cache_size = int(os.environ.get("WDS_CACHE_SIZE", args.cache_size))
        args.cache_dir = os.environ.get("WDS_CACHE", args.cache_dir)
        if args.cache_dir is not None:
            args.cache_dir = os.path.expanduser(args.cache_dir)

    def create_url_iterator(self, args: SimpleNamespace) -> None:
        """webdataset's hook that appends the stage yielding ``{"url": ...}`` items.

        wdsx's own constructor reads the shard list with its planner instead. A subclass
        that overrides this method gets webdataset's pipeline: its URL stage, then
        ``nodesplitter``, ``workersplitter``, the shard shuffle and ``tarfile_to_samples``
        (the stages of the functional form, without the planner's equal shares). Called from
        such an override, this appends the plain shard list (or the resampled one)."""
        if args.mode == "resampled" or args.resampled:
            self.append(shardlists.ResampledShards(args.urls))
        else:
            self.append(shardlists.SimpleShardList(args.urls))

    def _build_as_webdataset(self, args: SimpleNamespace, planner_arguments: list[str]) -> None:
        """The stages webdataset builds around a subclass's :meth:`create_url_iterator`, which
        have no place for the ``planner_arguments`` given (wdsx's own)."""
        if planner_arguments:
            raise ValueError(
                f"{type(self).__name__} overrides create_url_iterator, so it is built as webdataset "
                f"builds it, without wdsx's planner, and cannot use {', '.join(planner_arguments)}"
            )
        self.urls, self.manifest, self.reader = [], None, None
        self.create_url_iterator(args)
        for splitter in (args.nodesplitter, args.workersplitter):
            if splitter is not None:
                self.append(splitter)
        if args.shardshuffle and not args.resampled:
            if args.detshuffle:
                self.append(detshuffle_stage(args.shardshuffle, seed=self.seed))
            else:
                self.append(shuffle_stage(args.shardshuffle, seed=_order_seed(args.seed)))
        select = _file_selector(args.select_files)
        self.append(tarfile_to_samples(args.handler, select, args.rename_files, self.options))
        if args.empty_check:
            self.append(shardlists.NonEmpty())
        if args.repeat:
            self.repeat()

    # --- sample counts ----------------------------------------------------------------
    def _find_manifest(self, manifest: Any) -> tuple[Any, str | None]:
        """The manifest to use and its URL (None for one given as an object: it applies to
        every shard)."""
        if manifest is False:
            return None, None
        from wdsx.read.manifest import Manifest, find_manifest

        if isinstance(manifest, Manifest):
            return manifest, None
        if isinstance(manifest, str):
            found = Manifest.load(manifest, self.options)
            if found is None:
                raise ValueError(f"manifest {manifest} not found")
            return found, manifest
        if any(url.startswith("pipe:") for url in self.urls):  # never derive a command to run
            return None, None
        try:
            return find_manifest(self.urls[0], self.urls, self.options)
        except Exception as exn:  # a missing or unreadable manifest only means "no counts"
            log.debug("no manifest for %s: %s", self.urls[0], exn)
            return None, None

    def _initial_counts(self, counts: Sequence[int] | str | None) -> list[int] | None:
        if counts == "scan":
            return self._scan_counts()
        if isinstance(counts, str):
            raise ValueError(f"counts must be a list of sample counts or 'scan', not {counts!r}")
        if counts is not None:
            if len(counts) != len(self.urls):
                raise ValueError(f"counts has {len(counts)} entries for {len(self.urls)} shards")
            return list(counts)
        if self.manifest is not None and self._manifest_counts:
            return self.manifest.counts_for(self.urls)
        return header_counts(self.urls, self.options, self._settings.handler)

    def _scan_counts(self) -> list[int]:
        from wdsx.read.manifest import scan_counts

        log.info("counting samples in %d shards by scanning their headers", len(self.urls))
        settings = self._settings
        rename, select, handler = settings.rename_files, settings.select_files, settings.handler
        return [scan_counts(url, self.options, rename, select, handler) for url in self.urls]

    def prepare(self, topology: distributed.Topology, endless: bool) -> None:
        """Make sure a multi-rank job can give every rank the same number of batches: that
        needs per-shard sample counts, unless the epoch length is set explicitly (``endless``)."""
        reader = self.reader
        if (
            reader is None
            or topology.world_size <= 1
            or not reader.deal.split_ranks
            or reader.resampled
            or reader.deal.counts is not None
        ):
            return
        if endless or self.nsamples > 0:
            return
        if all(scheme_of(url) == "file" for url in self.urls):
            reader.deal = reader.deal.with_counts(self._scan_counts())
            return
        raise ValueError(
            "wdsx: a multi-rank job needs per-shard sample counts to give every rank the same number "
            "of batches. Write a manifest beside the shards (ShardWriter and `wdsx convert` do; "
            "`wdsx index URLS` makes one for existing shards), pass counts=[...], or set an explicit "
            "epoch length with .with_epoch(n) on the dataset or the WebLoader."
        )

    def __iter__(self) -> Iterator:
        # A WebLoader prepares its dataset before it starts its workers; the main process and
        # a plain DataLoader's workers (which the main process never prepares) do it here.
        if not distributed.in_loader_worker():
            self.prepare(distributed.current(self._captured), self.repetitions == sys.maxsize)
        return super().__iter__()


class FluidWrapper(DataPipeline):
    """A pipeline starting from any iterable, with the fluent methods (webdataset's FluidWrapper)."""

    def __init__(self, initial: Any):
        super().__init__(initial)
