"""Which format a shard is in, told by its name, and what the formats share.

A shard is a tar archive unless its name ends in a suffix of another format:

========================================  ==========================================
``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``  one sample per line (:mod:`wdsx.read.jsonl`)
``.npy``                                   one sample per row (:mod:`wdsx.read.npy`)
========================================  ==========================================

Every format keeps the cursor contract of :mod:`wdsx.read.shard`: a sample's
:class:`~wdsx.state.position.Position` is (URL, offset, ordinal, padding flag), a reader starts
from a :class:`~wdsx.read.samples.Cursor` and leaves it at the next sample. What the offset
means is the format's: the byte offset of a tar sample's first header or of a JSONL line,
the row index of an ``.npy`` sample.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Any, Protocol

from wdsx.core.compression import SHARD_SUFFIXES, named_compressed
from wdsx.read.samples import POSITION
from wdsx.sources.urls import without_query

JSONL_SUFFIXES = (".jsonl.gz", ".jsonl.bz2", ".jsonl.xz", ".jsonl.zst", ".jsonl")
NPY_SUFFIXES = (".npy",)
SUFFIXES = tuple(sorted((*SHARD_SUFFIXES, *JSONL_SUFFIXES, *NPY_SUFFIXES), key=len, reverse=True))
"""Every shard file ending wdsx reads, longest first (so that stripping one leaves the stem)."""


class Samples(Protocol):
    """What reading a piece of a shard gives: an iterator of samples that can be closed early."""

    def __iter__(self) -> Iterator[dict[str, Any]]: ...

    def __next__(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def format_of(url: str) -> str:
    """``"jsonl"``, ``"npy"`` or ``"tar"`` (anything else, compressed or not), by the name."""
    path = without_query(url)
    if path.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if path.endswith(NPY_SUFFIXES):
        return "npy"
    return "tar"


def shard_stem(url: str) -> str:
    """The shard's file name without its format suffix: ``s3://b/part-0003.jsonl.gz`` ->
    ``part-0003``. Samples of JSONL and ``.npy`` shards are keyed ``<stem>/<ordinal>``."""
    name = posixpath.basename(without_query(url))
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def seekable(url: str) -> bool:
    """Whether the format can start reading a shard at a byte offset: plain tar and plain
    JSONL can; compressed shards are read from their start, and ``.npy`` shards, which are
    read by rows, are opened at their start (their header) too."""
    path = without_query(url)
    return not (named_compressed(path) or path.endswith((".zst", *NPY_SUFFIXES)))


def with_extra(sample: dict[str, Any], extra: dict[str, Any] | None) -> dict[str, Any]:
    """``sample`` with the reader's extra fields (``__local_path__``, ``__pad__``); a padding
    repeat's position is marked as such."""
    if extra:
        sample.update(extra)
        if extra.get("__pad__"):
            sample[POSITION] = sample[POSITION].as_padding()
    return sample
