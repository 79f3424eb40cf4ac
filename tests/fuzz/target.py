"""One fuzz input through wdsx's public reading API, and the class of what happened.

An input is a base shard (:mod:`tests.fuzz.corpus`) with one to three mutations
(:mod:`tests.fuzz.mutate`), all decided by ``(seed, index)``, so any input can be rebuilt from
its index. It is read four ways, which must agree:

- ``tarfile_to_samples`` on a local file (the reader knows the file's size);
- ``tarfile_to_samples`` on an in-memory ``fuzzmem://`` URL whose reads return few bytes at a
  time (the reader knows no size: a pipe, an HTTP body);
- ``scan_counts`` on the file (headers only, seeking over payloads);
- for one input in eight, ``WebDataset`` on the file.

Outcome classes (:data:`FAILURES` are the ones that fail a campaign):

``ok``            no error, exactly the samples tar's rules give;
``error``         a wdsx error, on a shard the oracle calls damaged;
``strict``        a wdsx error on a shard ``tarfile`` reads (wdsx refuses more: sparse files,
                  global pax paths, a lone zero block before data, malformed pax records...);
``tolerated``     no error on a damaged shard, and exactly the undamaged shard's samples
                  (the damage was in bytes tar ignores);
``hang``          the watchdog fired;
``foreign``       an exception that is not a wdsx ``ShardError`` (also a ``tarfile.ReadError``);
``over-memory``   a ``MemoryError`` under the memory cap;
``silent-loss``   no error, and samples missing or altered;
``disagreement``  the four readings disagree (one fails and another does not, or different
                  samples, or a different count).
"""

from __future__ import annotations

import os
import random
import tarfile
from dataclasses import dataclass
from typing import Any

import wdsx
from tests.fuzz import corpus, mutate, oracle
from wdsx.core.errors import NoSamplesError
from wdsx.read.manifest import scan_counts
from wdsx.sources import Source, SourceOptions, register

FAILURES = ("hang", "foreign", "over-memory", "silent-loss", "disagreement", "crash")
OUTCOMES = ("ok", "error", "strict", "tolerated", *FAILURES)
_SUFFIX = {None: ".tar", "gzip": ".tar.gz", "bzip2": ".tar.bz2", "xz": ".tar.xz"}
_STEPS = (None, None, None, 61, 512, 513, 4096)

MEMORY: dict[str, bytes] = {}
"""The bytes behind ``fuzzmem://`` URLs."""


class Hang(BaseException):
    """Raised by the watchdog's alarm inside a reading that takes too long."""


@dataclass(frozen=True)
class Input:
    """One fuzz input."""

    index: int
    base: corpus.Base
    mutations: tuple[str, ...]
    data: bytes
    step: int | None
    """Bytes per read of the in-memory stream (None: as many as asked)."""
    whole_pipeline: bool


class _MemorySource(Source):
    """A ``fuzzmem://`` shard: bytes from :data:`MEMORY`, read in short steps."""

    def __init__(self, url: str, offset: int):
        self.url = url
        self.local_path = None
        name, _, step = url[len("fuzzmem://") :].partition("/")
        self._data = memoryview(MEMORY[name])
        self._position = offset
        self._step = int(step) if step else None

    def read(self, n: int) -> bytes:
        if self._step is not None:
            n = min(n, self._step)
        part = bytes(self._data[self._position : self._position + n])
        self._position += len(part)
        return part


def _open_memory(url: str, offset: int, options: SourceOptions) -> Source:
    return _MemorySource(url, offset)


register("fuzzmem", _open_memory)


def make_input(seed: int, index: int, bases: list[corpus.Base]) -> Input:
    """Input ``index`` of the campaign of ``seed``."""
    rng = random.Random(f"input:{seed}:{index}")
    base = rng.choice(bases)
    stream = base.compression is not None and rng.random() < 0.5
    chosen = mutate.choose(rng, stream)
    data = bytearray(base.stored() if stream else base.tar)
    for _, mutation in chosen:
        data = mutation(rng, data)
    stored = bytes(data) if stream else base.stored(bytes(data))
    return Input(
        index, base, tuple(name for name, _ in chosen), stored, rng.choice(_STEPS), rng.random() < 0.125
    )


def _plain(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples without what readers add (``__url__``, ``__position__``...): key and fields."""
    return [
        {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")} for sample in samples
    ]


@dataclass(frozen=True)
class Reading:
    """What one way of reading gave: samples (or a count), or an exception."""

    result: Any = None
    error: BaseException | None = None

    @property
    def wdsx_error(self) -> bool:
        return isinstance(self.error, wdsx.ShardError) and isinstance(self.error, tarfile.ReadError)


def _attempt(read: Any) -> Reading:
    try:
        return Reading(read())
    except Hang:
        raise
    except BaseException as exn:  # the class of any exception is what is being tested
        return Reading(error=_without_tracebacks(exn))


def _without_tracebacks(error: BaseException) -> BaseException:
    """``error`` and the errors it chains to, without their tracebacks: a traceback holds the
    reader's frames and buffers in a reference cycle that only a full garbage collection frees,
    and a campaign would grow by megabytes a second."""
    chained: BaseException | None = error
    visited: set[int] = set()
    while chained is not None and id(chained) not in visited:
        visited.add(id(chained))
        chained.__traceback__ = None
        chained = chained.__cause__ or chained.__context__
    return error


def read_all_ways(item: Input, scratch: str) -> dict[str, Reading]:
    """Read the input every way; raises :class:`Hang` when the watchdog fires."""
    path = os.path.join(scratch, f"input{_SUFFIX[item.base.compression]}")
    with open(path, "wb") as stream:
        stream.write(item.data)
    MEMORY.clear()
    MEMORY["m"] = item.data
    url = "fuzzmem://m" + (f"/{item.step}" if item.step else "")
    readings = {
        "file": _attempt(lambda: _plain(list(wdsx.tarfile_samples(iter([{"url": path}]))))),
        "memory": _attempt(lambda: _plain(list(wdsx.tarfile_samples(iter([{"url": url}]))))),
        "scan": _attempt(lambda: scan_counts(path)),
    }
    if item.whole_pipeline:
        readings["webdataset"] = _attempt(lambda: _plain(list(wdsx.WebDataset(path, manifest=False))))
    return readings


def classify(item: Input, readings: dict[str, Reading], original: list[dict[str, Any]]) -> tuple[str, str]:
    """The outcome class of an input and a one-line detail. ``original``: the samples of the
    undamaged base shard."""
    for name, reading in readings.items():
        if isinstance(reading.error, MemoryError):
            return "over-memory", f"{name}: MemoryError"
        if reading.error is not None and not reading.wdsx_error:
            return "foreign", f"{name}: {type(reading.error).__name__}: {str(reading.error)[:200]}"
    reads = [readings["file"], readings["memory"]]
    failed = [reading.error is not None for reading in reads]
    if any(failed) != all(failed) or (not any(failed) and reads[0].result != reads[1].result):
        return "disagreement", _describe(readings)
    scan = readings["scan"]
    if (scan.error is not None) != failed[0] or (scan.error is None and scan.result != len(reads[0].result)):
        return "disagreement", _describe(readings)
    whole = readings.get("webdataset")
    if whole is not None and not _whole_agrees(whole, reads[0]):
        return "disagreement", _describe(readings)
    expected = oracle.verdict(item.data)
    if failed[0]:
        return ("error" if not expected.clean else "strict"), str(reads[0].error)[:200]
    samples = reads[0].result
    if expected.clean:
        if samples == expected.samples:
            return "ok", ""
        return "silent-loss", f"{len(samples)} samples, tar's rules give {len(expected.samples or [])}"
    if samples == original:
        return "tolerated", expected.reason[:200]
    return "silent-loss", f"{len(samples)} samples from a damaged shard ({expected.reason[:160]})"


def _whole_agrees(whole: Reading, file: Reading) -> bool:
    """WebDataset reads like tarfile_samples, but raises webdataset's "No samples found" where
    a shard holds no sample."""
    if file.error is not None:
        return whole.error is not None
    if not file.result:
        return isinstance(whole.error, NoSamplesError)
    return whole.error is None and whole.result == file.result


def _describe(readings: dict[str, Reading]) -> str:
    parts = []
    for name, reading in readings.items():
        if reading.error is not None:
            parts.append(f"{name}: {type(reading.error).__name__}: {str(reading.error)[:100]}")
        else:
            parts.append(f"{name}: {reading.result if name == 'scan' else len(reading.result)}")
    return "; ".join(parts)
