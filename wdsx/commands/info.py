"""``wdsx info``: what a set of shards holds: samples, fields, sizes, classes."""

from __future__ import annotations

import argparse
from collections import Counter

from wdsx.commands.common import human, payload_bytes, raw_samples, shard_urls
from wdsx.read.formats import format_of
from wdsx.read.manifest import Manifest, manifest_url_beside
from wdsx.read.npy import read_header


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="summarise shards: samples, fields, sizes, classes")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    beside = manifest_url_beside(urls[0])
    manifest = Manifest.load(beside) if beside else None
    names = list(manifest.extra.get("classes", [])) if manifest else []
    fields: Counter = Counter()
    classes: Counter = Counter()
    samples = total = 0
    for url in urls:
        count = size = 0
        rows = ""
        if format_of(url) == "npy":  # the header says it all: no need to read the rows
            header = read_header(url)
            count, size = header.rows, header.data_bytes
            fields["npy"] += count
            rows = f", rows of {header.dtype} {list(header.shape[1:])}"
        for sample in raw_samples(url) if not rows else ():
            count += 1
            size += payload_bytes(sample)
            fields.update(key for key in sample if not key.startswith("__"))
            if "cls" in sample:
                classes[int(sample["cls"])] += 1
        print(f"{url}: {count} samples, {human(size)}{rows}")
        samples += count
        total += size
    print(f"total: {len(urls)} shards, {samples} samples, {human(total)} of payload")
    print("fields: " + ", ".join(f"{name} ({n})" for name, n in sorted(fields.items())))
    if classes:
        print("classes:")
        for index, n in sorted(classes.items()):
            label = names[index] if index < len(names) else ""
            print(f"  {index:>4} {label:<20} {n}")
    return 0
