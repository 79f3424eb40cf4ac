"""``wdsx bench``: how fast a pipeline reads given shards: samples/s, MB/s, time to the first
batch, and the mean and variance of the time between batches."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from wdsx import WebDataset, WebLoader
from wdsx.commands.common import human, payload_bytes, shard_urls


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="measure a reading pipeline over shards")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("--decode", default=None, help="image spec to decode with (rgb8, torchrgb, pil...)")
    parser.add_argument("--shuffle", type=int, default=0, help="shuffle buffer size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many batches")
    parser.set_defaults(run=run)


def _with_size(sample: dict[str, Any]) -> dict[str, Any]:
    sample["__bytes__"] = payload_bytes(sample)
    return sample


def _batch_bytes(batch: list[dict[str, Any]]) -> tuple[int, int]:
    return len(batch), sum(sample["__bytes__"] for sample in batch)


def run(args: argparse.Namespace) -> int:
    dataset = WebDataset(shard_urls(args.shards), shardshuffle=bool(args.shuffle)).map(_with_size)
    if args.decode:
        dataset = dataset.decode(args.decode)
    dataset = dataset.shuffle(args.shuffle).batched(args.batch_size, collation_fn=_batch_bytes)
    loader = WebLoader(dataset, batch_size=None, num_workers=args.workers)
    samples = payload = 0
    steps: list[float] = []
    started = last = time.perf_counter()
    first = None
    for number, (count, size) in enumerate(loader):
        now = time.perf_counter()
        if first is None:
            first = now - started
        else:
            steps.append(now - last)
        last = now
        samples += int(count)
        payload += int(size)
        if args.batches is not None and number + 1 >= args.batches:
            break
    elapsed = time.perf_counter() - started
    print(f"{samples} samples, {human(payload)} in {elapsed:.2f} s")
    print(f"throughput: {samples / elapsed:,.0f} samples/s, {payload / elapsed / 1e6:,.1f} MB/s")
    print(f"time to first batch: {1000 * (first or 0):.1f} ms")
    if len(steps) >= 2:
        mean, variance = statistics.mean(steps), statistics.variance(steps)
        stdev = 1000 * variance**0.5
        print(
            f"step time: mean {1000 * mean:.2f} ms, variance {1e6 * variance:.2f} ms^2, stdev {stdev:.2f} ms"
        )
    return 0
