"""Caching stages: the first complete pass goes through, later passes replay it.

:class:`Cached` (``.mcached()``) keeps the items in memory; :class:`LMDBCached`
(``.lmdb_cached(path)``) keeps them pickled in an LMDB database, so later runs reuse it too.
Only a pass that reached its end is cached; an interrupted one is read again next time.

Unlike webdataset 1.0.2, the LMDB cache replays items in the order they were first seen and
keeps every one of them (webdataset stores them under ``__key__``, so it replays them sorted by
key and keeps one of the samples that share a key); it opens the database when first iterated,
so the stage can be pickled into DataLoader workers. Its files are not interchangeable with webdataset's.
"""

from __future__ import annotations

import importlib
import os
import pickle
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from wdsx.stages.custom import PipelineStage

_REPLAYS = "a cache replays its first complete pass; resuming restarts that pass"


class Cached(PipelineStage):
    """Keep the items of the first complete pass in memory and replay them afterwards."""

    def __init__(self) -> None:
        self.cached: list | None = None

    def run(self, source: Iterable) -> Iterator:
        if self.cached is not None:
            yield from self.cached
            return
        seen = []
        for item in source:
            seen.append(item)
            yield item
        self.cached = seen

    def not_resumable(self) -> str | None:
        return _REPLAYS


_PREFIX = b"wdsx-item:"
_COMPLETE = b"wdsx-complete"


def _item_key(ordinal: int) -> bytes:
    return _PREFIX + ordinal.to_bytes(8, "big")


_environments: dict[tuple[int, str], Any] = {}
"""Open LMDB environments by (process, path): LMDB allows one per path and process, and an
environment must not be used across a fork."""


def _environment(path: str, map_size: int) -> Any:
    import lmdb

    key = (os.getpid(), os.path.realpath(path))
    if key not in _environments:
        _environments[key] = lmdb.open(path, readonly=False, map_size=map_size)
    return _environments[key]


class LMDBCached(PipelineStage):
    """Keep the items of the first complete pass in the LMDB database at ``fname`` (created if
    needed; needs the ``lmdb`` package).

    ``pickler`` is any module with ``dumps``/``loads``; ``chunksize`` items are written per
    transaction.
    """

    def __init__(
        self, fname: str, map_size: float = 1e12, pickler: ModuleType | Any = pickle, chunksize: int = 500
    ):
        import lmdb  # noqa: F401  (fail here, not in a worker, when lmdb is missing)

        self.fname = fname
        self.map_size = int(map_size)
        self.pickler = pickler
        self.chunksize = chunksize

    def _db(self) -> Any:
        return _environment(self.fname, self.map_size)

    def __getstate__(self) -> dict:
        # a module (the pickler) cannot be pickled; its name can
        state = dict(self.__dict__)
        if isinstance(self.pickler, ModuleType):
            state["pickler"] = self.pickler.__name__
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["pickler"], str):
            state["pickler"] = importlib.import_module(state["pickler"])
        self.__dict__.update(state)

    def complete_count(self) -> int | None:
        """How many items a complete pass stored, or None when no pass has completed."""
        with self._db().begin(write=False) as txn:
            marker = txn.get(_COMPLETE)
        return None if marker is None else int(marker)

    def is_complete(self) -> bool:
        """Whether a complete pass is stored (webdataset's name)."""
        return self.complete_count() is not None

    def _put(self, items: list[tuple[int, Any]], count: int | None = None) -> None:
        with self._db().begin(write=True) as txn:
            for ordinal, item in items:
                txn.put(_item_key(ordinal), self.pickler.dumps(item))
            if count is not None:
                txn.put(_COMPLETE, str(count).encode("ascii"))

    def _replay(self, count: int) -> Iterator:
        with self._db().begin(write=False) as txn:
            cursor = txn.cursor()
            if count and not cursor.set_key(_item_key(0)):
                raise ValueError(f"{self.fname}: the LMDB cache is damaged (its first item is missing)")
            for ordinal, (key, value) in enumerate(cursor):
                if ordinal == count:
                    break
                if key != _item_key(ordinal):
                    raise ValueError(f"{self.fname}: the LMDB cache is damaged (item {ordinal} is missing)")
                yield self.pickler.loads(value)

    def _record(self, source: Iterable) -> Iterator:
        pending: list[tuple[int, Any]] = []
        count = 0
        for count, item in enumerate(source, 1):
            pending.append((count - 1, item))
            if len(pending) >= self.chunksize:
                self._put(pending)
                pending = []
            yield item
        self._put(pending, count)

    def run(self, source: Iterable) -> Iterator:
        count = self.complete_count()
        return self._record(source) if count is None else self._replay(count)

    def not_resumable(self) -> str | None:
        return _REPLAYS
