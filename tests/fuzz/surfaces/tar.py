"""The tar surface: a base shard (:mod:`tests.fuzz.corpus`) with one to three mutations
(:mod:`tests.fuzz.mutate`), all decided by ``(seed, index)``, read four ways, which must agree:

- ``tarfile_to_samples`` on a local file (the reader knows the file's size);
- ``tarfile_to_samples`` on an in-memory ``fuzzmem://`` URL whose reads return few bytes at a
  time (the reader knows no size: a pipe, an HTTP body);
- ``scan_counts`` on the file (headers only, seeking over payloads);
- for one input in eight, ``WebDataset`` on the file.

The oracle (:mod:`tests.fuzz.oracle`) is Python's ``tarfile`` and webdataset's grouping. A
wdsx error here is a ``ShardError`` that is also a ``tarfile.ReadError``; ``strict`` means wdsx
refused a shard ``tarfile`` reads (sparse files, global pax paths, a lone zero block before
data, malformed pax records...).
"""

from __future__ import annotations

import os
import random
import tarfile
from dataclasses import dataclass
from typing import Any

import wdsx
from tests.fuzz import corpus, mutate, oracle
from tests.fuzz.memory import url_of
from tests.fuzz.outcomes import Reading, attempt, describe, first_failure
from wdsx.core.errors import NoSamplesError
from wdsx.read.manifest import scan_counts

_SUFFIX = {None: ".tar", "gzip": ".tar.gz", "bzip2": ".tar.bz2", "xz": ".tar.xz"}
STEPS = (None, None, None, 61, 512, 513, 4096)
"""Bytes per read of the in-memory stream (None: as many as asked)."""


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

    @property
    def what(self) -> str:
        return self.base.name

    @property
    def suffix(self) -> str:
        return _SUFFIX[self.base.compression]


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
        index, base, tuple(name for name, _ in chosen), stored, rng.choice(STEPS), rng.random() < 0.125
    )


def plain(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Samples without what readers add (``__url__``, ``__position__``...): key and fields."""
    return [
        {k: v for k, v in sample.items() if k == "__key__" or not k.startswith("__")} for sample in samples
    ]


def read_all_ways(item: Input, scratch: str) -> dict[str, Reading]:
    """Read the input every way; raises :class:`~tests.fuzz.outcomes.Hang` when the watchdog
    fires."""
    path = os.path.join(scratch, f"input{item.suffix}")
    with open(path, "wb") as stream:
        stream.write(item.data)
    url = url_of(item.data, f"input{item.suffix}", item.step)
    readings = {
        "file": attempt(lambda: plain(list(wdsx.tarfile_samples(iter([{"url": path}]))))),
        "memory": attempt(lambda: plain(list(wdsx.tarfile_samples(iter([{"url": url}]))))),
        "scan": attempt(lambda: scan_counts(path)),
    }
    if item.whole_pipeline:
        readings["webdataset"] = attempt(lambda: plain(list(wdsx.WebDataset(path, manifest=False))))
    return readings


def classify(item: Input, readings: dict[str, Reading], original: list[dict[str, Any]]) -> tuple[str, str]:
    """The outcome class of an input and a one-line detail. ``original``: the samples of the
    undamaged base shard."""
    failure = first_failure(readings, wdsx.ShardError, tarfile.ReadError)
    if failure is not None:
        return failure
    reads = [readings["file"], readings["memory"]]
    failed = [reading.error is not None for reading in reads]
    if any(failed) != all(failed) or (not any(failed) and reads[0].result != reads[1].result):
        return "disagreement", describe(readings)
    scan = readings["scan"]
    if (scan.error is not None) != failed[0] or (scan.error is None and scan.result != len(reads[0].result)):
        return "disagreement", describe(readings)
    whole = readings.get("webdataset")
    if whole is not None and not _whole_agrees(whole, reads[0]):
        return "disagreement", describe(readings)
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


class TarSurface:
    """Mutated tar shards (see the module's docstring)."""

    name = "tar"

    def __init__(self, seed: int, corpus_size: int = 64):
        self.bases = corpus.corpus(seed, corpus_size)
        self.originals = []
        for base in self.bases:
            verdict = oracle.verdict(base.stored())
            if not verdict.clean:
                raise AssertionError(f"corpus shard {base.name} is not clean: {verdict.reason}")
            self.originals.append(verdict.samples)

    def make(self, seed: int, index: int) -> Input:
        return make_input(seed, index, self.bases)

    def read(self, item: Input, scratch: str) -> dict[str, Reading]:
        return read_all_ways(item, scratch)

    def classify(self, item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
        return classify(item, readings, self.originals[self.bases.index(item.base)])


def build(seed: int, scratch: str) -> TarSurface:
    return TarSurface(seed)
