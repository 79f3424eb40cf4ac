"""``wdsx cat``: print one sample, one of its fields, or extract it to files."""

from __future__ import annotations

import argparse
import os
import sys

from wdsx.commands.common import field_bytes, raw_samples, shard_urls


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cat", help="show or extract one sample of a shard")
    parser.add_argument("shard", help="shard URL or pattern (its shards are searched in order)")
    parser.add_argument("key", help="sample key (__key__)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("-f", "--field", help="write this field's bytes to stdout")
    output.add_argument("-o", "--output", help="write every field to files in this directory")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls([args.shard])
    found = (s for url in urls for s in raw_samples(url) if s["__key__"] == args.key)
    sample = next(found, None)
    if sample is None:
        where = urls[0] if len(urls) == 1 else f"the {len(urls)} shards of {args.shard}"
        print(f"wdsx cat: no sample {args.key!r} in {where}", file=sys.stderr)
        return 1
    fields = {k: field_bytes(v) for k, v in sample.items() if not k.startswith("__")}
    if args.field:
        if args.field not in fields:
            print(
                f"wdsx cat: sample {args.key!r} has no field {args.field!r} (has {sorted(fields)})",
                file=sys.stderr,
            )
            return 1
        sys.stdout.buffer.write(fields[args.field])
        return 0
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        for ext, data in fields.items():
            path = os.path.join(args.output, os.path.basename(args.key) + "." + ext)
            with open(path, "wb") as stream:
                stream.write(data)
            print(path)
        return 0
    print(f"__key__: {sample['__key__']}")
    print(f"__position__: {sample['__position__']}")
    for ext, data in fields.items():
        print(f"{ext}: {_preview(data)}")
    return 0


def _preview(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(data)} bytes>"
    return repr(text) if len(text) <= 200 else repr(text[:200]) + f"... ({len(data)} bytes)"
