"""``wdsx ls``: the samples of a shard with their positions and field sizes."""

from __future__ import annotations

import argparse

from wdsx.commands.common import field_size, positive_int, raw_samples, shard_urls
from wdsx.read.samples import POSITION


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("ls", help="list the samples of shards: ordinal, offset, key, fields")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument(
        "-n", "--limit", type=positive_int, default=None, help="at most this many samples per shard"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for url in shard_urls(args.shards):
        print(f"# {url}")
        print(f"#{'ordinal':>8} {'offset':>12} key  fields (name:bytes)")
        for number, sample in enumerate(raw_samples(url)):
            if args.limit is not None and number >= args.limit:
                break
            _, offset, ordinal = sample[POSITION][:3]
            fields = " ".join(f"{k}:{field_size(v)}" for k, v in sample.items() if not k.startswith("__"))
            print(f"{ordinal:>9} {offset:>12} {sample['__key__']}  {fields}")
    return 0
