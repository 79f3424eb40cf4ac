"""JSONL and ``.npy`` shards: resume cost in a big plain JSONL shard, and the throughput of a
batched ``.npy`` pipeline against gathering the same rows straight from ``np.load(mmap)``.

    python benchmarks/bench_formats.py
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import wdsx  # noqa: E402
from benchmarks import data  # noqa: E402
from benchmarks.measure import compare  # noqa: E402

Row = tuple[str, str, str, str, str]


def big_jsonl(lines: int = 400_000) -> tuple[str, str]:
    """One plain and one gzipped JSONL shard of ``lines`` records of about 250 bytes."""
    directory = os.path.join(data.ROOT, "jsonl")
    os.makedirs(directory, exist_ok=True)
    plain, packed = os.path.join(directory, "big-0000.jsonl"), os.path.join(directory, "big-0000.jsonl.gz")
    if not (os.path.exists(plain) and os.path.exists(packed)):
        rng = np.random.default_rng(3)
        words = ["".join(chr(97 + c) for c in rng.integers(0, 26, 8)) for _ in range(500)]
        with wdsx.JsonlWriter(plain) as one, wdsx.JsonlWriter(packed) as two:
            for i in range(lines):
                text = " ".join(words[(i * 7 + k) % 500] for k in range(24))
                record = {"id": i, "text": text, "score": i / 7}
                one.write(record)
                two.write(record)
    return plain, packed


def _jsonl_pipeline(url: str) -> wdsx.WebDataset:
    return wdsx.WebDataset(url, manifest=False).to_tuple("json").batched(64)


def _state_after(url: str, batches: int) -> dict:
    dataset = _jsonl_pipeline(url)
    iterator = iter(dataset)
    for _ in range(batches):
        next(iterator)
    return json.loads(json.dumps(dataset.state_dict()))


def _first_batch(url: str, state: dict, repeats: int = 5) -> float:
    """Median seconds from loading ``state`` to holding the next batch."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        dataset = _jsonl_pipeline(url)
        dataset.load_state_dict(state)
        next(iter(dataset))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def jsonl_resume(lines: int = 400_000) -> dict[str, float]:
    """Time to the first batch after resuming at 10% and 90% of a big shard, plain (a seek) and
    gzipped (a re-read up to the offset)."""
    result = {}
    for name, url in zip(("plain", "gz"), big_jsonl(lines)):
        for depth in (10, 90):
            state = _state_after(url, lines * depth // 100 // 64)
            result[f"{name}_{depth}"] = _first_batch(url, state, 5 if name == "plain" else 2)
    result["size_mb"] = os.path.getsize(big_jsonl(lines)[0]) / 1e6
    return result


def npy_shards(nshards: int = 8, rows: int = 20_000, dim: int = 768) -> list[str]:
    """``nshards`` shards of ``rows`` float32 feature vectors of ``dim`` values."""
    directory = os.path.join(data.ROOT, f"npy-{dim}")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for shard in range(nshards):
        path = os.path.join(directory, f"feats-{shard:03d}.npy")
        if not os.path.exists(path):
            rng = np.random.default_rng(shard)
            np.save(path + ".partial.npy", rng.standard_normal((rows, dim), dtype=np.float32))
            os.replace(path + ".partial.npy", path)
        paths.append(path)
    return paths


def npy_throughput(urls: list[str], batch: int = 256, repeats: int = 5) -> dict[str, float]:
    """Rows per second of ``WebDataset(urls, shardshuffle=True).batched(batch)``, of
    ``np.load(url, mmap_mode="r").take(sorted rows)`` over exactly the same batches of rows,
    and of a bare Python loop that draws its own row orders.

    Both map the shards afresh in every run, as every epoch does (WebLoader's workers are new
    processes each epoch): the first touch of a mapped page costs a page fault in both."""

    def pipeline() -> wdsx.WebDataset:
        return wdsx.WebDataset(urls, shardshuffle=True).batched(batch)

    batches = []
    for item in pipeline():  # the rows of every batch, to gather the same ones directly
        positions = item["__position__"]
        batches.append((positions[0].url, np.sort([p.offset for p in positions])))

    def wdsx_run() -> int:
        return sum(len(b["npy"]) for b in pipeline())

    def take_run() -> int:
        arrays = {url: np.load(url, mmap_mode="r") for url in urls}
        return sum(len(arrays[url].take(rows, axis=0)) for url, rows in batches)

    def bare_loop() -> int:
        """What a hand-written loop does for the same epoch: a random order of each shard's
        rows, then one gather and one dict per batch (no keys, positions or state)."""
        rng, count = np.random.default_rng(), 0
        for url in rng.permutation(urls):
            array = np.load(url, mmap_mode="r")
            order = rng.permutation(len(array))
            for start in range(0, len(array) - batch + 1, batch):
                count += len({"npy": array.take(np.sort(order[start : start + batch]), axis=0)}["npy"])
        return count

    runs: dict[str, Callable[[], int]] = {"wdsx": wdsx_run, "take": take_run, "bare loop": bare_loop}
    take_run()  # the files in the page cache before timing
    return compare(runs, repeats)


def formats_table() -> list[Row]:
    resume = jsonl_resume()
    rows: list[Row] = [
        (
            f"JSONL: first batch after resume at 10% / 90% of a {resume['size_mb']:.0f} MB shard",
            f"{resume['plain_10'] * 1000:.0f} / {resume['plain_90'] * 1000:.0f} ms",
            f"{resume['gz_10'] * 1000:.0f} / {resume['gz_90'] * 1000:.0f} ms (.jsonl.gz, re-read)",
            f"90%/10% = {resume['plain_90'] / resume['plain_10']:.2f}",
            "<= 1.2",
        )
    ]
    for dim in (768, 64):
        urls = npy_shards(dim=dim)
        rates = npy_throughput(urls)
        rows.append(
            (
                f".npy: shuffled .batched(256), 160k x {dim} float32 rows, vs np.load(mmap).take(sorted)",
                f"{rates['wdsx']:,.0f} rows/s",
                f"{rates['take']:,.0f} rows/s (take)",
                f"{rates['wdsx'] / rates['take']:.2f}",
                ">= 0.8",
            )
        )
        rows.append(
            (
                f"... {dim}: a bare Python loop, a permutation per shard and one take per batch",
                f"{rates['bare loop']:,.0f} rows/s",
                f"{rates['take']:,.0f} rows/s (take)",
                f"{rates['bare loop'] / rates['take']:.2f}; "
                f"wdsx {rates['wdsx'] / rates['bare loop']:.2f} of it",
                "",
            )
        )
    return rows


if __name__ == "__main__":
    for row in formats_table():
        print(" | ".join(row))
