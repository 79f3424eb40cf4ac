"""``wdsx index``: a manifest for shards written by other tools, through
:func:`wdsx.read.manifest.build_manifest`."""

from __future__ import annotations

import argparse

from wdsx.commands.common import shard_urls
from wdsx.read.manifest import build_manifest, manifest_url_beside


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``wdsx index``."""
    parser = subparsers.add_parser(
        "index",
        help="write a manifest (sample counts, sizes, SHA-256) for existing shards",
        description="Read every shard once, count its samples and hash it, and write a manifest "
        "beside the shards (or at --output).",
    )
    parser.add_argument(
        "shards", nargs="+", help="shard URLs or patterns (braces, globs, s3://bucket/prefix/)"
    )
    parser.add_argument(
        "-o",
        "--output",
        help="manifest URL (default: derived from the first shard's name; required for pipe:)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``wdsx index``: build the manifest and write it."""
    urls = shard_urls(args.shards)
    output = args.output or manifest_url_beside(urls[0])
    if output is None:
        raise ValueError("a manifest for pipe: shards needs an explicit place: pass --output")
    manifest = build_manifest(urls)
    manifest.write(output)
    print(f"{output}: {len(manifest.shards)} shards, {manifest.total_samples} samples")
    return 0
