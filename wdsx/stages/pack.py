"""Sequence packing for language-model training: documents of tokens into fixed-length rows,
exactly resumable and elastic.

``pack("tokens", 4096)`` takes samples whose ``"tokens"`` field holds a document (a 1-D
integer array or list) and yields rows of exactly 4096 tokens with the document boundaries a
trainer needs (:mod:`wdsx.stages.packing.rows`). Two strategies place the documents
(:mod:`wdsx.stages.packing.strategies`): ``"greedy"`` appends them in arrival order,
``"best_fit"`` puts each into the open row (of at most ``window``) where it fits most tightly.

The stage holds documents between rows, so its checkpoint keeps the positions of the
documents it holds and how many tokens of each it has emitted
(:mod:`wdsx.stages.packing.state`); restoring reads them again and continues exactly. On an
elastic re-deal to another topology the held documents are dealt out again like any buffer's,
and the counts of tokens already emitted travel with them (:meth:`Pack.carried_state`), so every
token is delivered exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from wdsx.core.errors import NotResumableError
from wdsx.stages.base import Run, Stage
from wdsx.stages.packing.rows import RowBuilder, collate_packed
from wdsx.stages.packing.state import PackState
from wdsx.stages.packing.strategies import BestFitPacker, Document, GreedyPacker, Packer, Piece
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import Position, PositionTable

STRATEGIES = ("greedy", "best_fit")
OVERLONG = ("truncate", "error")


class Pack(Stage):
    """Pack the documents in field ``field`` into rows of ``length`` tokens (see :func:`pack`)."""

    state_key = "pack"
    state_type = PackState

    def __init__(
        self,
        field: str,
        length: int,
        strategy: str = "greedy",
        window: int = 16,
        split: bool = True,
        pad: int = 0,
        overlong: str = "truncate",
        dtype: Any = np.int64,
    ):
        if length < 1:
            raise ValueError(f"pack: length must be positive, got {length}")
        if strategy not in STRATEGIES:
            raise ValueError(f"pack: strategy must be one of {STRATEGIES}, got {strategy!r}")
        if window < 1:
            raise ValueError(f"pack: window must be at least 1 open row, got {window}")
        if overlong not in OVERLONG:
            raise ValueError(f"pack: overlong must be one of {OVERLONG}, got {overlong!r}")
        self.dtype = np.dtype(dtype)
        if self.dtype.kind not in "iu":
            raise ValueError(f"pack: dtype must be an integer type, got {self.dtype}")
        self.limits = np.iinfo(self.dtype)
        if not self.limits.min <= pad <= self.limits.max:
            raise ValueError(f"pack: pad {pad} does not fit dtype {self.dtype.name}")
        self.field = field
        self.length = length
        self.strategy = strategy
        self.window = window
        self.split = split
        self.pad = pad
        self.overlong = overlong

    def describe(self) -> str:
        return (
            f"pack({self.field!r}, {self.length}, strategy={self.strategy!r}, window={self.window}, "
            f"split={self.split}, pad={self.pad}, overlong={self.overlong!r}, dtype={self.dtype.name})"
        )

    def packer(self) -> Packer:
        """A fresh packer of this stage's strategy."""
        if self.strategy == "greedy":
            return GreedyPacker(self.length, self.split)
        return BestFitPacker(self.length, self.split, self.window)

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        state, restored = run.attach(index, PackState)
        packer = self.packer()
        builder = RowBuilder(self.field, self.length, self.pad, self.dtype)
        if restored:
            samples = run.reread(state.positions, index)
            documents = [self.document(sample, where) for sample, where in zip(samples, state.positions)]
            rows, pending = state.rebuilt(documents)
            state.follow(packer)
            yield from self._rows(packer.resume(rows, pending), run, builder)
        state.follow(packer)
        skips = state.skips
        for sample in upstream:
            document = self.document(sample, run.position)
            if skips:
                document.start = skips.pop(document.position, 0)
            if document.left():
                yield from self._rows(packer.add(document), run, builder)
        yield from self._rows(packer.finish(), run, builder)

    @staticmethod
    def _rows(placed: Iterator[list[Piece]], run: Run, builder: RowBuilder) -> Iterator[dict[str, Any]]:
        """The rows of ``placed``, each with ``run.position`` naming its documents."""
        for pieces in placed:
            row = builder.build(pieces)
            run.position = [document.position for document, _, _ in pieces]
            yield row

    def document(self, sample: Any, position: Any) -> Document:
        """The document a sample holds (cut to one row where documents are not split)."""
        if not isinstance(sample, dict) or self.field not in sample:
            found = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
            raise ValueError(f"pack: samples must be dicts with a {self.field!r} field, got {found}")
        tokens = np.asarray(sample[self.field])
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise ValueError(
                f"pack: field {self.field!r} must hold a 1-D sequence of integer tokens, "
                f"got shape {tokens.shape} of {tokens.dtype}"
            )
        key = sample.get("__key__")
        if not self.split and len(tokens) > self.length:
            if self.overlong == "error":
                raise ValueError(
                    f"pack: document {key!r} has {len(tokens)} tokens, more than a row of {self.length} "
                    "(split=False, overlong='error')"
                )
            tokens = tokens[: self.length]
        if tokens.size and not can_hold(self.limits, tokens):
            raise ValueError(
                f"pack: document {key!r} holds tokens from {tokens.min()} to {tokens.max()}, which "
                f"dtype {self.dtype.name} cannot hold ({self.limits.min} to {self.limits.max}): a wider "
                "dtype keeps them"
            )
        return Document(tokens, position, key)

    def replay(self, item: Any) -> Any:
        raise NotResumableError(
            "a stage after pack() holds rows over a checkpoint; batch the rows, or shuffle documents "
            "before packing"
        )

    def carried_state(
        self, saved: Sequence[tuple[JsonDict | None, PositionTable]], table: PositionTable
    ) -> JsonDict | None:
        """What every reader of an elastic re-deal starts with, from the old readers' ``saved``
        states: the documents partly emitted, each with the count of tokens emitted, so that
        whichever new reader reads one again skips those. None when there are none."""
        partly: dict[Position, int] = {}
        for data, old_table in saved:
            if data is not None:
                for position, start in PackState.from_json(data, old_table).partly_emitted().items():
                    # A reader keeps the counts it was handed for documents others went on to
                    # read: emitted counts only grow, so the largest is the current one.
                    partly[position] = max(start, partly.get(position, 0))
        return PackState(skips=partly).to_json(table) if partly else None


def can_hold(limits: np.iinfo, tokens: np.ndarray) -> bool:
    """Whether every token fits the integer type of ``limits`` (compared as Python ints, which
    no dtype can wrap)."""
    if np.can_cast(tokens.dtype, limits.dtype, casting="safe"):
        return True
    return limits.min <= int(tokens.min()) and int(tokens.max()) <= limits.max


def pack(
    field: str,
    length: int,
    *,
    strategy: str = "greedy",
    window: int = 16,
    split: bool = True,
    pad: int = 0,
    overlong: str = "truncate",
    dtype: Any = np.int64,
) -> Pack:
    """Pack token sequences into rows of exactly ``length`` tokens.

    Args:
        field: the sample field holding each document's tokens (a 1-D integer array or list).
        length: tokens per row.
        strategy: ``"greedy"`` appends documents in arrival order; ``"best_fit"`` puts each
            into the open row where it fits most tightly.
        window: ``"best_fit"`` only: how many rows may be open at once; opening one more first
            emits the fullest. More rows pack tighter and hold more documents.
        split: let a document continue into the next row (``"greedy"``: every row is full but
            the last; ``"best_fit"``: only documents longer than a row are split, into whole
            rows and a rest). False: a document is never split.
        pad: the token that fills the end of a row that is not full.
        overlong: with ``split=False``, what happens to a document longer than a row:
            ``"truncate"`` keeps its first ``length`` tokens, ``"error"`` raises ValueError.
        dtype: the integer type of the packed tokens.

    Each row is a dict of the tokens (under ``field``), ``segment_ids``, ``position_ids``,
    ``cu_seqlens``, ``__keys__`` and ``__starts__`` (see :mod:`wdsx.stages.packing.rows`);
    batch rows with ``batched(n, collation_fn=wdsx.collate_packed)``.
    """
    return Pack(field, length, strategy, window, split, pad, overlong, dtype)


__all__ = ["Pack", "collate_packed", "pack"]
