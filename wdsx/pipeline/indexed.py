"""Random access to the samples of shards: a map-style dataset, and a sampler that keeps reads
local to a shard.

``IndexedDataset(urls)[i]`` is sample ``i`` of the shards read in order — the sample an
unshuffled streaming read (``WebDataset(urls)``) yields ``i``-th, with the same fields and
position (but no ``__epoch_seed__``: a map-style dataset has no epoch). Only that sample is
read: a ``pread`` of a local file, or one ranged request for exactly its bytes. Where each
sample lies comes from the shard's offset index (:mod:`wdsx.read.index`: a ``.idx`` file
``wdsx index`` writes beside the shard, or, for local shards without one, a header scan); an
``.npy`` shard's header says where every row is. ``len()`` comes from the manifest when there
is one, else from the indexes and headers.

It is a plain map-style dataset (``__getitem__`` and ``__len__``, picklable), so it works with
``torch.utils.data.DataLoader``, ``DistributedSampler`` and torchdata's
``StatefulDataLoader``. :class:`ShardLocalSampler` orders indices shard by shard (shuffling
shards and the samples inside each), so that consecutive reads hit the same file.
"""

from __future__ import annotations

import io
import operator
import os
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from wdsx.core import topology
from wdsx.core.errors import ShardError
from wdsx.core.limits import max_line_bytes
from wdsx.read import formats
from wdsx.read.deal import epoch_order
from wdsx.read.index import ShardIndex, check_indexable, shard_index
from wdsx.read.jsonl import Overlong, line_sample
from wdsx.read.manifest import Manifest, find_manifest
from wdsx.read.npy import NpyHeader, Rows, epoch_row_seed, read_header, read_row, row_order, row_sample
from wdsx.read.samples import Cursor, group_members
from wdsx.read.tar import BLOCK, iter_members, read_exact
from wdsx.sources import SourceOptions, local_path, open_source, rewrite_url
from wdsx.sources.listing import expand_urls

OPEN_FILES = 16
"""Local shard files a dataset keeps open between reads."""


def _manifest_counts(urls: Sequence[str], manifest: Any, options: SourceOptions) -> list[int] | None:
    """Per-shard counts from the manifest (None: find the one beside the shards; a URL or a
    :class:`Manifest`: that one; False: none), or None when it does not list every shard."""
    if manifest is False:
        return None
    if not isinstance(manifest, Manifest):
        if isinstance(manifest, str):
            found = Manifest.load(manifest, options)
        else:
            found = find_manifest(urls[0], urls, options)[0]
        if found is None:
            if isinstance(manifest, str):
                raise ValueError(f"manifest {manifest} not found")
            return None
        manifest = found
    return manifest.counts_for(urls)


class IndexedDataset:
    """Sample ``i`` of tar, JSONL and ``.npy`` shards, reading only that sample.

    Args:
        urls: shard URLs or patterns, as for ``WebDataset`` (uncompressed tar and JSONL
            shards, and ``.npy`` shards; compressed shards are refused with a message).
        manifest: where the per-shard counts come from: None finds the manifest beside the
            shards, a URL or a :class:`~wdsx.read.manifest.Manifest` uses that one, False
            counts from the offset indexes and ``.npy`` headers.
        options: how shards are fetched (timeouts, retries, S3 settings).
    """

    def __init__(
        self, urls: str | Iterable[str], *, manifest: Any = None, options: SourceOptions | None = None
    ):
        self.options = options or SourceOptions()
        self.urls = expand_urls(urls, self.options)
        if not self.urls:
            raise ValueError(f"IndexedDataset: no shards in {urls!r}")
        for url in self.urls:
            check_indexable(url)
        self._reset()
        counts = _manifest_counts(self.urls, manifest, self.options)
        self.counts: list[int] = (
            counts if counts is not None else [self._count(s) for s in range(len(self.urls))]
        )
        self.starts = np.concatenate([[0], np.cumsum(self.counts, dtype=np.int64)])
        """``starts[s]``: the index of shard ``s``'s first sample; ``starts[-1]``: the length."""

    def _reset(self) -> None:
        self._indexes: dict[int, ShardIndex] = {}
        self._headers: dict[int, NpyHeader] = {}
        self._rows: dict[int, Rows] = {}
        self._files: OrderedDict[str, int] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (for DataLoader workers): open files and loaded indexes stay behind."""
        state = dict(self.__dict__)
        for cache in ("_indexes", "_headers", "_rows", "_files"):
            state.pop(cache)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def shard_of(self, index: int) -> tuple[int, int]:
        """``(shard number, ordinal in the shard)`` of sample ``index`` (an int, a numpy
        integer or a 0-d integer tensor: what samplers give; negative counts from the end, as
        for a list)."""
        try:
            if isinstance(index, (bool, np.bool_)):
                raise TypeError
            number = operator.index(index)  # an int, a numpy integer, a 0-d integer tensor
        except TypeError:
            raise TypeError(f"a sample index is an int, not a {type(index).__name__} ({index!r})") from None
        given = index = number
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"sample index {given} out of range for {len(self)} samples")
        shard = int(np.searchsorted(self.starts, index, side="right")) - 1
        return shard, index - int(self.starts[shard])

    def __getitem__(self, index: int) -> dict[str, Any]:
        shard, ordinal = self.shard_of(index)
        url = self.urls[shard]
        path = local_path(rewrite_url(url))
        extra = {"__local_path__": path} if path is not None else None
        kind = formats.format_of(url)
        if kind == "npy":
            sample = row_sample(url, formats.shard_stem(url), ordinal, ordinal, self._row(shard, ordinal))
            return formats.with_extra(sample, extra)
        offsets = self._index(shard)
        if offsets.samples != self.counts[shard]:
            raise ShardError(
                url,
                None,
                f"its offset index lists {offsets.samples} samples, its manifest {self.counts[shard]}",
            )
        start, end = offsets.extent(ordinal)
        if kind == "jsonl" and end - start > max_line_bytes() + 1:  # refused without reading it
            line_sample(url, formats.shard_stem(url), start, ordinal, Overlong(end - start), True)
        data = self._read(url, path, start, end)
        if kind == "jsonl":
            ended = data.endswith(b"\n")
            line = data[:-1] if ended else data
            sample = line_sample(url, formats.shard_stem(url), start, ordinal, line, ended)
            return formats.with_extra(sample, extra)
        return self._tar_sample(url, data, start, ordinal, extra)

    # --- counts and per-shard lookups ---------------------------------------------------
    def _count(self, shard: int) -> int:
        if formats.format_of(self.urls[shard]) == "npy":
            return self._header(shard).rows
        return self._index(shard).samples

    def _index(self, shard: int) -> ShardIndex:
        found = self._indexes.get(shard)
        if found is None:
            found = self._indexes[shard] = shard_index(self.urls[shard], self.options)
        return found

    def _header(self, shard: int) -> NpyHeader:
        found = self._headers.get(shard)
        if found is None:
            found = self._headers[shard] = read_header(self.urls[shard], self.options)
        return found

    def _row(self, shard: int, ordinal: int) -> np.ndarray:
        url = self.urls[shard]
        if local_path(rewrite_url(url)) is None:
            return read_row(url, self._header(shard), ordinal, self.options)
        rows = self._rows.get(shard)
        if rows is None:
            rows = self._rows[shard] = Rows.open(url, self.options)
        return rows.row(ordinal)

    # --- reading one sample's bytes ------------------------------------------------------
    def _read(self, url: str, path: str | None, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the shard: a ``pread`` of a kept-open local file, or one
        ranged request."""
        if path is None:
            with open_source(url, start, self.options, end=end) as source:
                data = read_exact(source.read, end - start)
        else:
            data = os.pread(self._file(path), end - start, start)
        if len(data) < end - start:
            raise ShardError(
                url, start, f"the shard ends before this sample's end at byte {end} (truncated?)"
            )
        return data

    def _file(self, path: str) -> int:
        fd = self._files.get(path)
        if fd is None:
            if len(self._files) >= OPEN_FILES:
                os.close(self._files.popitem(last=False)[1])
            fd = self._files[path] = os.open(path, os.O_RDONLY)
        self._files.move_to_end(path)
        return fd

    def _tar_sample(
        self, url: str, data: bytes, start: int, ordinal: int, extra: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The sample whose members are ``data`` (read from byte ``start``), grouped as the
        streaming reader groups them (an end-of-archive marker is added for the parser)."""
        stream = io.BytesIO(data + bytes(2 * BLOCK))
        members = iter_members(stream, url, start, max(len(data) + 2 * BLOCK, 4 * BLOCK))
        samples = group_members(members, url, Cursor(start, ordinal), stop=ordinal + 1, extra=extra)
        sample = next(samples, None)
        if sample is None:
            raise ShardError(url, start, f"no sample in the bytes the offset index gives sample {ordinal}")
        return sample

    def close(self) -> None:
        """Close the local files kept open."""
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def __del__(self) -> None:
        files = getattr(self, "_files", None)
        if files:
            self.close()


class ShardLocalSampler:
    """Indices of an :class:`IndexedDataset` shard by shard, so that consecutive reads stay in
    one file: with ``shuffle``, the shards in a new order every epoch and the samples inside
    each in a new order too (both pure functions of ``seed`` and the epoch, the same orders
    a ``WebDataset`` of ``.npy`` shards reads with ``shardshuffle`` and no seed, for
    ``seed=0``; a seed asks a ``WebDataset`` for webdataset's order instead).

    With several replicas (ranks; by default those of ``torch.distributed`` or the launcher's
    environment), each takes a contiguous share of the epoch's order, so each rank reads
    whole runs of a shard. As with ``DistributedSampler``, shares are made equal by repeating
    indices from the start (or, with ``drop_last``, by dropping the tail), and
    :meth:`set_epoch` must be called before each epoch.
    """

    def __init__(
        self,
        dataset: IndexedDataset,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ):
        if num_replicas is None or rank is None:
            found_rank, found_world = topology.rank_and_world()
            num_replicas = found_world if num_replicas is None else num_replicas
            rank = found_rank if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.urls, self.counts, self.starts = dataset.urls, dataset.counts, dataset.starts
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        total = int(self.starts[-1])
        self.num_samples = total // num_replicas if drop_last else -(-total // num_replicas)

    def set_epoch(self, epoch: int) -> None:
        """Use the orders of ``epoch`` from now on."""
        self.epoch = epoch

    def __len__(self) -> int:
        """Indices this replica yields per epoch."""
        return self.num_samples

    def order(self) -> np.ndarray:
        """Every index of the epoch, in reading order (before the split into shares)."""
        shards = epoch_order(len(self.urls), self.seed, self.epoch, self.shuffle)
        row_seed = epoch_row_seed(self.seed, self.epoch) if self.shuffle else None
        parts = []
        for shard in shards:
            inside = row_order(self.counts[shard], self.urls[shard], row_seed)
            rows = np.arange(self.counts[shard]) if inside is None else inside
            parts.append(rows + self.starts[shard])
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        need = self.num_samples * self.num_replicas
        if need > len(order) and len(order):
            order = np.resize(order, need)  # repeats from the start, as DistributedSampler pads
        share = order[self.rank * self.num_samples : (self.rank + 1) * self.num_samples]
        return iter(share.tolist())
