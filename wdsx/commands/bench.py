"""``wdsx bench``: how fast a pipeline reads given shards: samples/s, MB/s, time to the first
batch, and the mean and standard deviation of the time between batches (both in ms, so they
compare directly)."""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from typing import Any

from wdsx import DataPipeline, Mix, WebDataset, WebLoader
from wdsx.commands.common import human, payload_bytes, positive_int, shard_urls


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("bench", help="measure a reading pipeline over shards")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("--decode", default=None, help="image spec to decode with (rgb8, torchrgb, pil...)")
    parser.add_argument("--shuffle", type=int, default=0, help="shuffle buffer size")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--batches", type=positive_int, default=None, help="stop after this many batches")
    parser.add_argument(
        "--mix-with",
        action="append",
        default=[],
        metavar="SHARDS",
        help="another dataset to mix with the first (repeatable); prints each one's share",
    )
    parser.add_argument("--weights", default=None, help="mixing weights, comma-separated (default: equal)")
    parser.add_argument(
        "--profile", action="store_true", help="print where the time went: each stage, transport, trainer"
    )
    parser.set_defaults(run=run)


def _with_size(sample: dict[str, Any]) -> dict[str, Any]:
    sample["__bytes__"] = payload_bytes(sample)
    return sample


def _batch_bytes(batch: list[dict[str, Any]]) -> tuple[int, int, list[int]]:
    """Samples, payload bytes, and which source (of a mixture) each sample came from."""
    return len(batch), sum(sample["__bytes__"] for sample in batch), [s.get("__source__", 0) for s in batch]


def _source(patterns: list[str], args: argparse.Namespace, number: int = 0) -> DataPipeline:
    dataset = WebDataset(shard_urls(patterns), shardshuffle=bool(args.shuffle)).map(_with_size)
    if number:
        dataset = dataset.map(functools.partial(_tagged, number=number))
    return dataset.decode(args.decode) if args.decode else dataset


def _tagged(sample: dict[str, Any], number: int) -> dict[str, Any]:
    sample["__source__"] = number
    return sample


def run(args: argparse.Namespace) -> int:
    if args.weights and not args.mix_with:
        raise ValueError("--weights are the mixture's: name the datasets to mix with --mix-with")
    dataset = _source(args.shards, args)
    if args.mix_with:
        weights = [float(w) for w in args.weights.split(",")] if args.weights else None
        sources = [dataset] + [_source([p], args, n) for n, p in enumerate(args.mix_with, 1)]
        dataset = Mix(sources, weights, stop="all")
    dataset = dataset.shuffle(args.shuffle).batched(args.batch_size, collation_fn=_batch_bytes)
    loader = WebLoader(dataset, batch_size=None, num_workers=args.workers, profile=args.profile)
    samples = payload = 0
    shares = [0] * (1 + len(args.mix_with))
    steps: list[float] = []
    started = last = time.perf_counter()
    first = None
    for number, (count, size, sources) in enumerate(loader):
        now = time.perf_counter()
        if first is None:
            first = now - started
        else:
            steps.append(now - last)
        last = now
        samples += int(count)
        payload += int(size)
        for source in sources:
            shares[int(source)] += 1
        if args.batches is not None and number + 1 >= args.batches:
            break
    elapsed = time.perf_counter() - started
    print(f"{samples} samples, {human(payload)} in {elapsed:.2f} s")
    print(f"throughput: {samples / elapsed:,.0f} samples/s, {payload / elapsed / 1e6:,.1f} MB/s")
    print(f"time to first batch: {1000 * (first or 0):.1f} ms")
    if args.mix_with:
        for number, share in enumerate(shares):
            print(f"source {number}: {share} samples ({100 * share / max(1, sum(shares)):.1f}%)")
    if len(steps) >= 2:
        mean, stdev = statistics.mean(steps), statistics.stdev(steps)
        print(f"step time: mean {1000 * mean:.2f} ms, standard deviation {1000 * stdev:.2f} ms")
    if args.profile:
        print(loader.stats())
    return 0
