"""``wdsx index``: a manifest for shards written by other tools, through
:func:`wdsx.read.manifest.build_manifest`, and beside each uncompressed tar or JSONL shard its
offset index for random access (:mod:`wdsx.read.index`), with ``--sizes`` also each sample's
measures for bucketing (:mod:`wdsx.read.sizes`)."""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections import Counter

from wdsx.commands.common import shard_urls
from wdsx.read import formats
from wdsx.read.index import NotIndexableError, index_url, scan_index
from wdsx.read.manifest import build_manifest, manifest_url_beside
from wdsx.sources import scheme_of


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``wdsx index``."""
    parser = subparsers.add_parser(
        "index",
        help="write a manifest (sample counts, sizes, SHA-256) for existing shards",
        description="Read every shard once, count its samples and hash it, and write a manifest "
        "beside the shards (or at --output); then write, beside each uncompressed tar or JSONL "
        "shard, its offset index <shard>.idx (where each sample starts) for random access.",
    )
    parser.add_argument(
        "shards", nargs="+", help="shard URLs or patterns (braces, globs, s3://bucket/prefix/)"
    )
    parser.add_argument(
        "-o",
        "--output",
        help="manifest URL (default: derived from the first shard's name; required for pipe:)",
    )
    parser.add_argument("--no-offsets", action="store_true", help="write the manifest only")
    parser.add_argument(
        "--sizes",
        action="store_true",
        help="also record in each offset index every sample's image widths and heights (read from "
        "the image headers, never decoded), for WebDataset(..., index_sizes=True)",
    )
    parser.add_argument(
        "--tokens-field",
        action="append",
        default=[],
        metavar="NAME",
        help="with --sizes, also record the length of the list NAME in each JSON value (a JSONL "
        "line, a .json member) as json.NAME; may be repeated",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``wdsx index``: build the manifest and write it."""
    if args.tokens_field and not args.sizes:
        raise ValueError("--tokens-field is measured with --sizes: pass both")
    if args.sizes and args.no_offsets:
        raise ValueError("--sizes are recorded in the offset indexes: drop --no-offsets")
    urls = shard_urls(args.shards)
    # one manifest where --output names it (readers given it match shards by name), else
    # one in each folder, where readers look for it
    groups = {"": urls} if args.output is not None else _by_folder(urls)
    for group in groups.values():
        _named_once(group)
    for folder_urls in groups.values():
        output = args.output or manifest_url_beside(folder_urls[0], folder_urls)
        if output is None:
            raise ValueError("a manifest for pipe: shards needs an explicit place: pass --output")
        manifest = build_manifest(folder_urls)
        manifest.write(output)
        print(f"{output}: {len(manifest.shards)} shards, {manifest.total_samples} samples")
    failed = 0
    if not args.no_offsets:
        written = []
        for url in filter(has_offsets, urls):
            try:
                scan_index(url, sizes=args.sizes, list_fields=args.tokens_field).write(url)
                written.append(url)
            except NotIndexableError as exn:  # compressed without saying so: a note, not a failure
                print(f"wdsx index: no offset index: {exn}", file=sys.stderr)
            except ValueError as exn:  # a member not measurable as asked
                print(f"wdsx index: error: no offset index: {exn}", file=sys.stderr)
                failed += 1
        if written:
            print(f"offset indexes: {len(written)} written beside the shards, {index_url(written[0])}...")
    return 1 if failed else 0


def _by_folder(urls: list[str]) -> dict[str, list[str]]:
    """The shards grouped by folder: a manifest lists the shards of its folder by name, and
    readers look for it in each shard's folder."""
    folders: dict[str, list[str]] = {}
    for url in urls:
        folders.setdefault(posixpath.dirname(url), []).append(url)
    return folders


def _named_once(urls: list[str]) -> None:
    """Refuse two shards of one name in one manifest (it lists shards by name)."""
    twice = sorted(name for name, n in Counter(map(posixpath.basename, urls)).items() if n > 1)
    if twice:
        raise ValueError(f"two shards named {twice[0]!r} would share a manifest, which lists shards by name")


def has_offsets(url: str) -> bool:
    """Whether an offset index is written for the shard at ``url``: an uncompressed tar or JSONL
    shard in a store (``.npy`` headers locate rows by themselves; ``pipe:`` has no place beside)."""
    return formats.format_of(url) != "npy" and formats.seekable(url) and scheme_of(url) != "pipe"
