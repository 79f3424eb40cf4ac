"""``wdsx verify``: every shard parses, matches its manifest entry, and its images decode.

The exit status is 0 only if every check passes, so it can gate a pipeline.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from wdsx.codecs.decode import IMAGE_EXTENSIONS, ImageHandler
from wdsx.commands.common import raw_samples, shard_urls
from wdsx.core.errors import WdsxError
from wdsx.read import formats
from wdsx.read.index import index_url, load_index, scan_index
from wdsx.read.manifest import Manifest, ShardEntry, index_shard, manifest_url_beside, shard_name
from wdsx.sources import scheme_of

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
    if decode_images or formats.format_of(url) != "tar":  # JSONL lines are parsed, .npy rows read
        decoder = ImageHandler("rgb8")
        try:
            for sample in raw_samples(url):
                if decode_images:
                    problems += _image_problems(sample, decoder)
        except (WdsxError, OSError) as exn:
            problems.append(str(exn))
    return problems + _offsets_problems(url)


def _image_problems(sample: dict[str, Any], decoder: ImageHandler) -> list[str]:
    """The image fields of ``sample`` that do not decode."""
    problems = []
    for ext, data in sample.items():
        if ext.rsplit(".", 1)[-1] in _IMAGES:
            try:
                decoder("." + ext, data)
            except Exception as exn:
                problems.append(f"sample {sample['__key__']!r} field {ext!r} does not decode: {exn}")
    return problems


def _offsets_problems(url: str) -> list[str]:
    """A problem when the shard's offset index (``<shard>.idx``), if it has one, does not match it.
    A ``pipe:`` shard has no place beside it: ``pipe:CMD x.tar.idx`` is a command nobody wrote."""
    if scheme_of(url) == "pipe":
        return []
    try:
        written = load_index(url)
        if written is None or np.array_equal(written.offsets, scan_index(url).offsets):
            return []
    except (WdsxError, OSError, ValueError) as exn:
        return [f"offset index {index_url(url)}: {exn}"]
    return [f"offset index {index_url(url)} does not match the shard (re-run `wdsx index`)"]


def _checked(manifest_url: str | None, found: bool, images: bool) -> str:
    """What a run checked, against what, for its summary line."""
    checks = ["every tar header and member, JSONL line and .npy row read; offset indexes compared"]
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
        expected = entries.get(shard_name(url))
        problems = check_shard(url, expected, not args.no_images)
        if manifest is not None and expected is None:
            problems.append("not listed in the manifest")
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {url}" + "".join(f"\n     {p}" for p in problems))
    checked = _checked(manifest_url, manifest is not None, not args.no_images)
    print(f"{len(urls) - failed} of {len(urls)} shards ok: {checked}")
    return 1 if failed else 0
