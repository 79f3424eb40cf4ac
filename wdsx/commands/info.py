"""``wdsx info``: what a set of shards holds: samples, fields, sizes, classes."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Sequence

from wdsx.commands.common import human, payload_bytes, raw_samples, shard_urls
from wdsx.core.errors import ShardError
from wdsx.read.formats import format_of
from wdsx.read.manifest import find_manifest
from wdsx.read.npy import read_header
from wdsx.sources import local_path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("info", help="summarise shards: samples, fields, sizes, classes")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    names = _class_names(urls[0], urls)
    fields: Counter = Counter()
    classes: Counter = Counter()
    samples = total = 0
    for url in urls:
        count = size = 0
        rows = ""
        if format_of(url) == "npy":  # the header says it all: no need to read the rows
            header = read_header(url)
            path = local_path(url)
            if path is not None and os.path.getsize(path) < header.data_offset + header.data_bytes:
                raise ShardError(url, os.path.getsize(path), "the shard is shorter than its header says")
            count, size = header.rows, header.data_bytes
            fields["npy"] += count
            rows = f", rows of {header.dtype} {list(header.shape[1:])}"
        for sample in raw_samples(url) if not rows else ():
            count += 1
            size += payload_bytes(sample)
            fields.update(key for key in sample if not key.startswith("__"))
            if "cls" in sample:
                classes[_class_of(sample["cls"])] += 1
        print(f"{url}: {count} samples, {human(size)}{rows}")
        samples += count
        total += size
    print(f"total: {len(urls)} shards, {samples} samples, {human(total)} of payload")
    print("fields: " + ", ".join(f"{name} ({n})" for name, n in sorted(fields.items())))
    if classes:
        print("classes:")
        for index, n in sorted(classes.items(), key=lambda item: (isinstance(item[0], str), item[0])):
            label = names[index] if isinstance(index, int) and 0 <= index < len(names) else ""
            print(f"  {index:>4} {label:<20} {n}")
    return 0


def _class_names(url: str, urls: Sequence[str]) -> list[str]:
    """The class names of the manifest beside ``url``, if it lists them; a manifest that
    cannot be read only costs the names (a note on stderr)."""
    try:
        manifest = find_manifest(url, urls)[0]
    except ValueError as exn:
        print(f"wdsx info: note: no class names: {exn}", file=sys.stderr)
        return []
    return [str(name) for name in manifest.extra.get("classes", [])] if manifest else []


def _class_of(value: bytes) -> int | str:
    """A ``.cls`` field as its class: the number it holds, or its text when it holds none."""
    text = value.decode("utf-8", "replace").strip()
    try:
        return int(text)
    except ValueError:
        return text
