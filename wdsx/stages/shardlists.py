"""Shard lists: URL patterns, epoch order, splitting by rank and worker, resampling.

Patterns follow webdataset: ``::`` joins several patterns, ``${VAR}`` reads ``WDS_VAR`` from
the environment, ``{000000..000999}`` brace-expands. On top, a pattern with ``*`` / ``?`` /
``[..]``, an ``s3://bucket/prefix/`` ending in a slash, or a local directory is expanded by
listing.

Where webdataset's order is a function of a seed, wdsx gives the same order:
``SimpleShardList(urls, seed=s)`` shuffles with ``random.Random(s)`` (the same order every
epoch), and ``ResampledShards(..., deterministic=True)`` draws from webdataset's per-reader,
per-epoch seed. Where webdataset's order is random (``seed=True``, resampling without
``deterministic``), wdsx's is still a pure function of its seed and the epoch, so runs repeat
and resume exactly.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from wdsx.core import rng
from wdsx.core import topology as distributed
from wdsx.core.redact import redact_text
from wdsx.core.torchdataset import iterable_dataset
from wdsx.core.utilities import make_seed
from wdsx.read.deal import epoch_order
from wdsx.sources.listing import expand_urls
from wdsx.stages.base import Run, Stage, shards_summary


def split_by_node(src: Iterable, group: Any = None) -> Iterator:
    """Every ``world_size``-th item, starting at this rank (webdataset-compatible).

    As ``WebDataset(nodesplitter=...)`` this is the default, and wdsx deals the epoch across
    ranks itself (at sample granularity when counts are known)."""
    rank, world, _, _ = distributed.pytorch_worker_info(group=group)
    return islice(src, rank, None, world) if world > 1 else iter(src)


def split_by_worker(src: Iterable) -> Iterator:
    """Every ``num_workers``-th item, starting at this DataLoader worker."""
    _, _, worker, workers = distributed.pytorch_worker_info()
    return islice(src, worker, None, workers) if workers > 1 else iter(src)


def single_node_only(src: Iterable, group: Any = None) -> Iterator:
    """Refuse to run in a multi-rank job (webdataset's old default nodesplitter)."""
    _, world, _, _ = distributed.pytorch_worker_info(group=group)
    if world > 1:
        raise ValueError(
            "single_node_only: this pipeline runs on one node only, but the job has several ranks"
        )
    return iter(src)


@iterable_dataset
class ShardListStage(Stage):
    """A shard list that programs written for webdataset subclass, overriding ``__iter__``:
    such a subclass's own ``__iter__`` gives the shards, called as webdataset calls it."""

    own_epochs = 0
    """Epochs a subclass's own ``__iter__`` ran in this process."""

    def __iter__(self) -> Iterator[dict[str, str]]:
        raise NotImplementedError

    def own_iteration(self) -> Iterator:
        """The subclass's own ``__iter__``, counting the epochs it ran in this process."""
        self.own_epochs += 1
        return iter(self)

    def not_replayable(self) -> str | None:
        """A subclass that iterates itself may keep a count of its own (an epoch it
        increments, as webdataset's classes do), which lives in the object: after its first
        epoch in a process, a resumed run's fresh object would start it afresh. (In WebLoader
        workers each epoch iterates a fresh copy, so the question never arises.)"""
        if self.own_epochs <= 1:
            return None
        return (
            f"{type(self).__name__} iterates itself (its own __iter__) and has run {self.own_epochs} "
            "epochs in this process; a count it keeps would start afresh in a resumed run"
        )


class SimpleShardList(ShardListStage):
    """The shard list as ``{"url": ...}`` items. With an int seed, shuffled by
    ``random.Random(seed)`` as webdataset does (the same order every epoch); with
    ``seed=True`` (webdataset: a random seed), a new order every epoch."""

    def __init__(self, urls: str | Iterable[str], seed: int | bool | None = None):
        self.urls = expand_urls(urls)
        if not self.urls:
            raise ValueError("SimpleShardList: no shards")
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.urls)

    def describe(self) -> str:
        digest = rng.derive_seed("\n".join(map(redact_text, self.urls)))  # (see ShardReader)
        return f"shardlist(n={len(self.urls)}, hash={digest:016x}, seed={self.seed})"

    def __repr__(self) -> str:
        return f"shardlist({shards_summary(self.urls)}, seed={self.seed})"

    def _items(self, epoch: int) -> Iterator[dict[str, str]]:
        if self.seed is True:  # webdataset seeds from the time: any fixed seed will do
            order = epoch_order(len(self.urls), 1, epoch, True)
        else:
            order = list(range(len(self.urls)))
            if self.seed is not None:
                random.Random(self.seed).shuffle(order)
        return ({"url": self.urls[i]} for i in order)

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        if type(self).__iter__ is not SimpleShardList.__iter__:
            return self.own_iteration()
        return self._items(run.epoch)

    def __iter__(self) -> Iterator[dict[str, str]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        return self._items(epoch)


class ResampledShards(ShardListStage):
    """Shards drawn with replacement, ``nshards`` per epoch, from a per-reader seeded stream.

    With ``deterministic=True`` the draws are webdataset's: ``random.Random`` seeded from the
    reader's ``worker_seed()`` (default ``rank * 1000 + worker``), the epoch and ``seed``.
    Otherwise webdataset mixes in the time and process id; wdsx draws from a stream of
    (``seed``, epoch, reader) instead, so it is deterministic all the same (pass a different
    seed for a different run)."""

    def __init__(
        self,
        urls: str | Iterable[str],
        nshards: int = sys.maxsize,
        seed: int = 0,
        worker_seed: Any = None,
        deterministic: bool = False,
        max_urls: int = int(1e6),
        empty_check: bool = True,
    ):
        self.urls = expand_urls(urls)[:max_urls]
        if empty_check and not self.urls:
            raise ValueError("ResampledShards: no shards")
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = worker_seed
        self.deterministic = deterministic
        self.epoch = -1  # as webdataset's: counts the passes iterated directly, from 0

    def describe(self) -> str:
        drawn = ", as webdataset's deterministic draws" if self.deterministic else ""
        return f"resampled(n={len(self.urls)}, nshards={self.nshards}, seed={self.seed}{drawn})"

    def _items(self, epoch: int, topology: distributed.Topology) -> Iterator[dict[str, str]]:
        if self.deterministic:
            reader_seed = (
                topology.rank * 1000 + topology.worker if self.worker_seed is None else self.worker_seed()
            )
            generator = random.Random(make_seed(reader_seed, epoch, self.seed))
            for _ in range(self.nshards):
                yield {"url": self.urls[generator.randint(0, len(self.urls) - 1)]}
            return
        stream = rng.derive_seed("resampled-shards", self.seed, epoch, topology.consumer)
        for draw in range(self.nshards):
            yield {"url": self.urls[rng.below(stream, draw, len(self.urls))]}

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        if type(self).__iter__ is not ResampledShards.__iter__:
            return self.own_iteration()
        return self._items(run.epoch, run.topology)

    def __iter__(self) -> Iterator[dict[str, str]]:
        self.epoch += 1
        return self._items(self.epoch, distributed.current())


ResampledShardList = ResampledShards


def non_empty(src: Iterable) -> Iterator:
    """Pass items through; raise if there were none."""
    count = 0
    for item in src:
        count += 1
        yield item
    if count == 0:
        raise ValueError("pipeline stage received no data at all")


class NonEmpty(Stage):
    """:func:`non_empty` as a stage a checkpoint can hold: items pass through, and an epoch
    that yields none raises. A resumed epoch is not checked (its items may all have come
    before the checkpoint)."""

    def describe(self) -> str:
        return "non_empty"

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return upstream if run.restore is not None else non_empty(upstream)


def shardspec(spec: str) -> SimpleShardList:
    """A shard list from a pattern (YAML specs are not supported)."""
    if spec.endswith((".yaml", ".yml")):
        raise ValueError(f"{spec}: YAML shard specs are not supported by wdsx")
    return SimpleShardList(spec)
