"""``wdsx verify``: every shard parses, matches its manifest entry, and its images decode.

The exit status is 0 only if every check passes, so it can gate a pipeline.
"""

from __future__ import annotations

import argparse
import posixpath

from wdsx.codecs.decode import IMAGE_EXTENSIONS, ImageHandler
from wdsx.commands.common import raw_samples, shard_urls
from wdsx.core.errors import WdsxError
from wdsx.read.manifest import Manifest, ShardEntry, index_shard, manifest_url_for_shard

_IMAGES = frozenset(IMAGE_EXTENSIONS)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check shards: parse, manifest counts and SHA-256, images decode"
    )
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("--manifest", help="manifest URL (default: the one beside the shards, if any)")
    parser.add_argument("--no-images", action="store_true", help="skip decoding images")
    parser.set_defaults(run=run)


def check_shard(url: str, expected: ShardEntry | None, decode_images: bool) -> list[str]:
    """Problems found in one shard (an empty list when it is sound); ``expected`` is its manifest
    entry, when the manifest lists it."""
    try:
        entry = index_shard(url)
    except (WdsxError, OSError) as exn:
        return [str(exn)]
    problems = []
    if expected is not None:
        for field in ("samples", "bytes", "sha256"):
            if getattr(entry, field) != getattr(expected, field):
                problems.append(
                    f"{field} is {getattr(entry, field)}, manifest says {getattr(expected, field)}"
                )
    if decode_images:
        decoder = ImageHandler("rgb8")
        for sample in raw_samples(url):
            for ext, data in sample.items():
                if ext.rsplit(".", 1)[-1] in _IMAGES:
                    try:
                        decoder("." + ext, data)
                    except Exception as exn:
                        problems.append(f"sample {sample['__key__']!r} field {ext!r} does not decode: {exn}")
    return problems


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    manifest = Manifest.load(args.manifest or manifest_url_for_shard(urls[0]))
    if args.manifest and manifest is None:
        print(f"manifest {args.manifest} not found")
        return 1
    entries = {entry.name: entry for entry in manifest.shards} if manifest else {}
    failed = 0
    for url in urls:
        expected = entries.get(posixpath.basename(url))
        problems = check_shard(url, expected, not args.no_images)
        if manifest is not None and expected is None:
            problems.append("not listed in the manifest")
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {url}" + "".join(f"\n     {p}" for p in problems))
    source = "the manifest" if manifest else "no manifest found"
    print(f"{len(urls) - failed} of {len(urls)} shards ok ({source})")
    return 1 if failed else 0
