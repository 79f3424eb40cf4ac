"""``wdsx verify``: every shard parses, matches its manifest entry, and its images decode.

The exit status is 0 only if every check passes, so it can gate a pipeline.
"""

from __future__ import annotations

import argparse
import posixpath

from wdsx.codecs.decode import IMAGE_EXTENSIONS, ImageHandler
from wdsx.commands.common import raw_samples, shard_urls
from wdsx.core.errors import WdsxError
from wdsx.read.manifest import Manifest, ShardEntry, index_shard, manifest_url_beside

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


def _checked(manifest_url: str | None, found: bool, images: bool) -> str:
    """What a run checked, against what, for its summary line."""
    checks = ["every tar header and member read"]
    if found:
        checks.append(f"sample count, size and SHA-256 compared with the manifest {manifest_url}")
    elif manifest_url:
        checks.append(f"no manifest at {manifest_url}, so counts and hashes were not compared")
    else:
        checks.append("no manifest looked up for pipe: shards (pass --manifest)")
    checks.append("every image decoded" if images else "images not decoded (--no-images)")
    return "; ".join(checks)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    manifest_url = args.manifest or manifest_url_beside(urls[0])
    manifest = Manifest.load(manifest_url) if manifest_url else None
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
    checked = _checked(manifest_url, manifest is not None, not args.no_images)
    print(f"{len(urls) - failed} of {len(urls)} shards ok: {checked}")
    return 1 if failed else 0
