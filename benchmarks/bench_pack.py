"""Sequence packing: tokens per second of the ``pack`` stage in one process, on documents held in
memory, beside a plain NumPy packing of the same documents into the same greedy rows (the whole
corpus at once, no stage and no per-document Python work: the bound for this layout).

    python benchmarks/bench_pack.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import wdsx  # noqa: E402
from benchmarks.measure import compare  # noqa: E402

Row = tuple[str, str, str, str, str]

LENGTH = 4096
"""Tokens per row."""

TARGET = 20e6
"""Tokens per second the stage must pack."""


def documents(count: int = 40_000, seed: int = 0) -> list[dict]:
    """Documents of int32 tokens whose lengths follow a log-normal law (median about 400,
    mean about 660 tokens, at most two rows), as samples ``pack`` reads."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.0, 1.0, count).astype(int), 1, 2 * LENGTH)
    tokens = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.int32)
    pieces = np.split(tokens, np.cumsum(lengths)[:-1])
    return [{"__key__": f"doc{i:06d}", "tokens": piece} for i, piece in enumerate(pieces)]


def numpy_greedy(docs: list[dict], length: int = LENGTH) -> list[dict]:
    """The rows greedy splitting packing gives, computed for the whole corpus at once with
    array passes: tokens, segment ids, position ids and cu_seqlens of each row."""
    lengths = np.array([len(doc["tokens"]) for doc in docs])
    total = int(lengths.sum())
    rows = -(-total // length)
    size = rows * length
    tokens = np.zeros(size, dtype=np.int64)
    np.concatenate([doc["tokens"] for doc in docs], out=tokens[:total], casting="same_kind")
    begins = np.zeros(size, dtype=bool)  # where a segment begins: a document or a row does
    begins[np.cumsum(lengths)[:-1]] = True
    begins[::length] = True
    begins[total:] = False
    segment_ids = np.cumsum(begins, dtype=np.int32).reshape(rows, length)
    segment_ids -= segment_ids[:, :1] - 1
    index = np.arange(size, dtype=np.int32)
    position_ids = index - np.maximum.accumulate(np.where(begins, index, 0))
    segment_ids.reshape(-1)[total:] = 0
    position_ids[total:] = 0
    bounds = np.flatnonzero(begins)
    first = np.searchsorted(bounds, np.arange(0, size + 1, length))
    packed = []
    for row in range(rows):
        cu = np.append(bounds[first[row] : first[row + 1]], min(total, (row + 1) * length)) - row * length
        packed.append(
            {
                "tokens": tokens[row * length : (row + 1) * length],
                "segment_ids": segment_ids[row],
                "position_ids": position_ids[row * length : (row + 1) * length],
                "cu_seqlens": cu.astype(np.int32),
            }
        )
    return packed


def same_rows(ours: list[dict], reference: list[dict]) -> bool:
    """Whether the stage's rows equal the reference's, field by field."""
    fields = ("tokens", "segment_ids", "position_ids", "cu_seqlens")
    return len(ours) == len(reference) and all(
        np.array_equal(a[name], b[name]) for a, b in zip(ours, reference) for name in fields
    )


def rates(docs: list[dict], repeats: int = 3) -> dict[str, float]:
    """Median input tokens per second of each packer, interleaved."""
    total = sum(len(doc["tokens"]) for doc in docs)

    def timed(make):  # each run returns the tokens it packed
        return lambda: (sum(1 for _ in make()), total)[1]

    return compare(
        {
            "greedy": timed(lambda: wdsx.pack("tokens", LENGTH)(docs)),
            "best_fit": timed(lambda: wdsx.pack("tokens", LENGTH, strategy="best_fit", window=16)(docs)),
            "numpy": timed(lambda: numpy_greedy(docs)),
        },
        repeats,
    )


def pack_table(repeats: int = 3) -> list[Row]:
    """Rows for ``benchmarks/run.py``: each strategy's rate beside the NumPy reference's (in the
    webdataset column), after checking that greedy packing gives the reference's rows."""
    docs = documents()
    if not same_rows(list(wdsx.pack("tokens", LENGTH)(docs)), numpy_greedy(docs)):
        raise AssertionError("pack() and the NumPy reference packed different rows")
    measured = rates(docs, repeats)
    target = f">= {TARGET / 1e6:.0f}M tokens/s"
    return [
        (
            f"pack({LENGTH}, {name}), tokens/s vs NumPy greedy",
            f"{measured[name] / 1e6:.1f}M",
            f"{measured['numpy'] / 1e6:.1f}M",
            f"{measured[name] / measured['numpy']:.2f}x",
            target,
        )
        for name in ("greedy", "best_fit")
    ]


if __name__ == "__main__":
    for row in pack_table():
        print(" | ".join(row))
