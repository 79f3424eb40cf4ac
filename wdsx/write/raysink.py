"""Write a Ray dataset as wdsx shards: ``dataset.write_datasink(ShardSink("out/train-%06d.tar"))``.

Each row is one sample. Its columns are the sample's fields, named by extension (``jpg``,
``txt``, ``json``, ``cls``, ``npy``...) and encoded as ``TarWriter(encoder=True)`` encodes
them; a column that is None in a row is left out of that sample. The key column (default
``__key__``) gives the sample's key; without it a key is made from the write task's index and
the row's place in that task (``000003_000000042``). Ray Data stores a column of dicts as an
Arrow struct, whose rows all have every key (None where a dict had none): to keep ``json``
fields exactly as given when their dicts differ in keys, give them as JSON text.

How it writes:

- every Ray write task cuts its rows into shards of at most ``maxcount`` samples and
  ``maxsize`` payload bytes (``ShardWriter``'s rule) and writes each one, atomically, under a
  hidden staging name (``.train.<write id>.staging/000003-000001.tar``, for task 3's second
  shard); a task that Ray runs again (its worker died) writes the same staging names again;
- when every task is done, the driver numbers the shards in the order (task index, shard within
  the task) and renames each staged shard to ``pattern % number`` (a rename in the same
  filesystem: a final name never holds a partial shard), then writes the manifest
  (:class:`~wdsx.read.manifest.Manifest`, shards in number order) atomically and removes the
  staging directory. A failed write removes its staging directory and renames nothing.

Shard names are thus deterministic for a given dataset and block layout: Ray numbers write
tasks in the order their blocks reach the write. For a dataset computed by earlier
operations, set ``DataContext.get_current().execution_options.preserve_order = True`` so that
this order does not depend on which task finishes first. Pass ``rows_per_write`` (say,
``maxcount``) to have Ray gather small blocks into each write task, so shards come out full.

The destination must be a local path; on a multi-node cluster, one on a filesystem that every
node and the driver mount at the same place. Stale shards of an earlier, larger write to the
same pattern are not removed.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from wdsx.read.manifest import Manifest, ShardEntry, manifest_url_for_pattern
from wdsx.sources import SourceOptions, local_path, rewrite_url
from wdsx.write.engines.ray import import_ray
from wdsx.write.partial import write_whole
from wdsx.write.plan import shard_pattern
from wdsx.write.writer import TarWriter, checked_pattern, compression_for, shard_is_full

import_ray("ShardSink")
from ray.data import Datasink  # noqa: E402  (after the check that says how to install Ray)
from ray.data.block import BlockAccessor  # noqa: E402

__all__ = ["ShardSink"]


def _local(url: str) -> str:
    """The filesystem path of ``url``; ValueError when it names no local file."""
    path = local_path(rewrite_url(url))
    if path is None:
        raise ValueError(
            f"ShardSink writes local paths (on a cluster, a filesystem every node sees), not {url!r}"
        )
    return path


class ShardSink(Datasink):
    """A Ray Data sink writing wdsx shards ``pattern % n`` and their manifest (see the module's
    docstring for naming, keys and atomicity). ``dest`` is the pattern, or a prefix as
    ``write_dataset`` takes it (``out/train`` -> ``out/train-%06d.tar``).

    ``manifest``: True writes it at :func:`~wdsx.read.manifest.manifest_url_for_pattern`, a str
    at that path; ``extra`` adds top-level manifest fields (such as ``classes``). ``options``
    are passed to the manifest's writer.
    """

    def __init__(
        self,
        dest: str,
        *,
        maxcount: int = 10000,
        maxsize: float = 1e9,
        key_column: str | None = "__key__",
        manifest: bool | str = True,
        extra: Mapping[str, Any] | None = None,
        rows_per_write: int | None = None,
        options: SourceOptions | None = None,
    ):
        if maxcount < 1 or maxsize <= 0:
            raise ValueError("maxcount and maxsize must be positive")
        self.pattern = checked_pattern(shard_pattern(dest))
        first = _local(self.pattern % 0)
        stem = posixpath.basename(manifest_url_for_pattern(self.pattern)).removesuffix(".manifest.json")
        self.staging = os.path.join(os.path.dirname(first), f".{stem}.{uuid.uuid4().hex[:12]}.staging")
        """Where this sink's tasks write their shards before the driver names them."""
        self.maxcount, self.maxsize = maxcount, maxsize
        self.key_column = key_column
        self.manifest_url = manifest_url_for_pattern(self.pattern) if manifest is True else manifest or None
        self.extra = dict(extra or {})
        self.rows_per_write = rows_per_write
        self.options = options
        self._compression = compression_for(self.pattern, None)
        base = os.path.basename(first)
        self._suffix = base[base.index(".") :] if "." in base else ""
        """The final names' ending (``.tar``, ``.tar.gz``), given to the staged names too."""
        self.shards: list[ShardEntry] = []
        """The shards written, in number order (set once the write completes)."""

    @property
    def min_rows_per_write(self) -> int | None:
        return self.rows_per_write

    def _sample(self, row: Mapping[str, Any], key: str) -> dict[str, Any]:
        sample = {name: value for name, value in row.items() if value is not None and name != self.key_column}
        given = row.get(self.key_column) if self.key_column is not None else None
        sample["__key__"] = key if given is None else str(given)
        return sample

    def write(self, blocks: Iterable[Any], ctx: Any) -> list[dict[str, Any]]:
        """Write this task's rows as staged shards; returns one entry per shard."""
        task = ctx.task_idx
        staged: list[dict[str, Any]] = []
        writer: TarWriter | None = None
        size = 0.0
        row_number = 0
        try:
            for block in blocks:
                rows: Iterable[Mapping[str, Any]] = BlockAccessor.for_block(block).iter_rows(True)
                for row in rows:
                    if writer is not None and shard_is_full(writer.count, size, self.maxcount, self.maxsize):
                        staged.append(self._finish(writer, task, len(staged)))
                        writer = None
                    if writer is None:
                        path = os.path.join(self.staging, f"{task:06d}-{len(staged):06d}{self._suffix}")
                        writer, size = TarWriter(path, compress=self._compression or False), 0.0
                    size += writer.write(self._sample(row, f"{task:06d}_{row_number:09d}"))
                    row_number += 1
            if writer is not None:
                staged.append(self._finish(writer, task, len(staged)))
                writer = None
        finally:
            if writer is not None:
                writer.abort()
        return staged

    @staticmethod
    def _finish(writer: TarWriter, task: int, part: int) -> dict[str, Any]:
        writer.close()
        assert writer.url is not None
        return {
            "task": task,
            "part": part,
            "path": writer.url,
            "entry": ShardEntry("", writer.count, writer.bytes_written, writer.sha256),
        }

    def on_write_complete(self, write_result: Any) -> None:
        """Name the staged shards ``pattern % n`` in (task, part) order, then write the manifest."""
        staged = sorted(
            (shard for returned in write_result.write_returns for shard in returned or ()),
            key=lambda shard: (shard["task"], shard["part"]),
        )
        self.shards = []
        for number, shard in enumerate(staged):
            final = _local(self.pattern % number)
            os.makedirs(os.path.dirname(os.path.abspath(final)), exist_ok=True)
            os.replace(shard["path"], final)
            entry = shard["entry"]
            self.shards.append(ShardEntry(os.path.basename(final), entry.samples, entry.bytes, entry.sha256))
        if self.manifest_url is not None:
            text = Manifest(self.shards, dict(self.extra)).to_json()
            write_whole(self.manifest_url, text.encode("utf-8"), self.options)
        shutil.rmtree(self.staging, ignore_errors=True)

    def on_write_failed(self, error: Exception) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def get_name(self) -> str:
        return "WdsxShards"
