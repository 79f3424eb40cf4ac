"""``wdsx verify``: every shard parses, matches its manifest entry, and its images decode.

The exit status is 0 only if every check passes, so it can gate a pipeline. Images are
checked one at a time and dropped: each header's size is checked against the pixel limit
(:mod:`wdsx.core.limits`) before any pixel is decoded, and a JPEG is decoded at its smallest
scale (which still reads every coefficient), so memory stays bounded however many images a
shard holds. What Pillow warns about while decoding (truncated EXIF data, palette
transparency...) is gathered into the report, counted by message, instead of printed raw; a
warning does not fail a shard. Progress goes to stderr when it is a terminal (``--progress``
forces it, ``--no-progress`` turns it off).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wdsx.codecs.decode import IMAGE_EXTENSIONS, open_image
from wdsx.commands.common import Progress, raw_samples, shard_urls
from wdsx.core.errors import WdsxError
from wdsx.core.limits import check_image_pixels, max_image_pixels
from wdsx.read import formats
from wdsx.read.index import index_url, load_index, scan_index
from wdsx.read.manifest import Manifest, ShardEntry, index_shard, manifest_places, shard_name
from wdsx.sources import scheme_of

_IMAGES = frozenset(IMAGE_EXTENSIONS)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify", help="check shards: parse, manifest counts and SHA-256, images decode"
    )
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("--manifest", help="manifest URL (default: the one beside the shards, if any)")
    parser.add_argument("--no-images", action="store_true", help="skip decoding images")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress on stderr (default: when stderr is a terminal)",
    )
    parser.set_defaults(run=run)


@dataclass
class ShardReport:
    """What checking one shard found: problems (the shard fails) and decoder warnings (it
    does not), each warning message with how many images raised it and where it came first."""

    problems: list[str] = field(default_factory=list)
    warnings: Counter[str] = field(default_factory=Counter)
    first_warned: dict[str, str] = field(default_factory=dict)
    images: int = 0
    """Image fields decoded (or tried)."""
    undecodable: int = 0
    """Those that did not decode."""
    index_compared: bool = False
    """Whether the shard has an offset index, compared with the shard."""

    def warned(self, message: str, where: str) -> None:
        self.warnings[message] += 1
        self.first_warned.setdefault(message, where)

    def lines(self) -> list[str]:
        """The report's lines under the shard's ``ok``/``FAIL`` line."""
        notes = []
        for message, count in self.warnings.items():
            images = f"{count} image{'s' if count > 1 else ''}"
            notes.append(f"warning ({images}, first {self.first_warned[message]}): {message}")
        return self.problems + notes


def check_shard(
    url: str, expected: ShardEntry | None, decode_images: bool, progress: Progress | None = None
) -> ShardReport:
    """Check one shard; ``expected`` is its manifest entry, when the manifest lists it;
    ``progress`` is advanced by one for every sample read."""
    report = ShardReport()
    try:
        entry = index_shard(url)
    except (WdsxError, OSError) as exn:
        report.problems.append(str(exn))
        return report
    if expected is not None:
        for name in ("samples", "bytes", "sha256"):
            if getattr(entry, name) != getattr(expected, name):
                report.problems.append(
                    f"{name} is {getattr(entry, name)}, manifest says {getattr(expected, name)}"
                )
    if decode_images or formats.format_of(url) != "tar":  # JSONL lines are parsed, .npy rows read
        limit = max_image_pixels()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for sample in raw_samples(url):
                    if decode_images:
                        _check_images(sample, limit, report, caught)
                    if progress is not None:
                        progress.update()
        except (WdsxError, OSError) as exn:
            report.problems.append(str(exn))
    report.index_compared, problems = _offsets_problems(url)
    report.problems += problems
    return report


def _check_images(
    sample: dict[str, Any], limit: int | None, report: ShardReport, caught: list[warnings.WarningMessage]
) -> None:
    """Decode the image fields of ``sample``, noting those that fail and what they warned."""
    for ext, data in sample.items():
        if ext.rsplit(".", 1)[-1].lower() in _IMAGES and isinstance(data, bytes):
            where = f"sample {sample['__key__']!r} field {ext!r}"
            problem = image_problem(data, limit)
            report.images += 1
            if problem is not None:
                report.undecodable += 1
                report.problems.append(f"{where} does not decode: {problem}")
            for warning in caught:
                report.warned(str(warning.message), where)
            caught.clear()


def image_problem(data: bytes, limit: int | None) -> str | None:
    """Why the image ``data`` does not decode within the pixel ``limit``; None when it does.
    The decoded pixels are dropped at once."""
    try:
        with open_image(data) as image:
            check_image_pixels(image.height, image.width, limit)
            if image.format == "JPEG":
                image.draft(image.mode, (1, 1))  # the smallest scale: 1/64 of the pixels
            image.load()
    except Exception as exn:  # any decoder's failure is a finding about the data
        return str(exn) or type(exn).__name__
    return None


def _offsets_problems(url: str) -> tuple[bool, list[str]]:
    """Whether the shard has an offset index (``<shard>.idx``) to compare, and a problem when
    it does not match the shard. A ``pipe:`` shard has no place beside it: ``pipe:CMD
    x.tar.idx`` is a command nobody wrote."""
    if scheme_of(url) == "pipe":
        return False, []
    try:
        written = load_index(url)
        if written is None:
            return False, []
        if np.array_equal(written.offsets, scan_index(url).offsets):
            return True, []
    except (WdsxError, OSError, ValueError) as exn:
        return True, [f"offset index {index_url(url)}: {exn}"]
    return True, [f"offset index {index_url(url)} does not match the shard (re-run `wdsx index`)"]


def _checked(manifest_url: str | None, found: bool, images: bool, reports: list[ShardReport]) -> str:
    """What a run checked (its shards' ``reports``), against what (``manifest_url``: the
    manifest, or what says where the manifests were), for its summary line."""
    compared = sum(report.index_compared for report in reports)
    decoded = sum(report.images for report in reports)
    failed = sum(report.undecodable for report in reports)
    indexes = f"{compared} offset index{'es' if compared != 1 else ''} compared"
    checks = [f"every tar header and member, JSONL line and .npy row read; {indexes}"]
    if found:
        checks.append(f"sample count, size and SHA-256 compared with the manifest {manifest_url}")
    elif manifest_url:
        checks.append(f"no manifest at {manifest_url}, so counts and hashes were not compared")
    else:
        checks.append("no manifest looked up for pipe: shards (pass --manifest)")
    if not images:
        checks.append("images not decoded (--no-images)")
    elif decoded == 0:
        checks.append("no image fields found")
    else:
        checks.append(f"{decoded} images decoded, {failed} of them failed")
    return "; ".join(checks)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    # each shard's manifest: the one given, else the one beside it (in its own folder)
    places = [args.manifest] * len(urls) if args.manifest else manifest_places(urls)
    manifests = {place: Manifest.load(place) for place in set(places) if place is not None}
    if args.manifest and manifests[args.manifest] is None:
        raise ValueError(f"manifest {args.manifest} not found")
    entries = {
        place: {entry.name: entry for entry in manifest.shards}
        for place, manifest in manifests.items()
        if manifest is not None
    }
    listed = [
        entries.get(place, {}).get(shard_name(url)) if place else None for url, place in zip(urls, places)
    ]
    found = [place for place in dict.fromkeys(places) if place in entries]
    manifest_url = (
        found[0] if len(found) == 1 else places[0] if not found else f"in each of the {len(found)} folders"
    )
    total = sum(entry.samples for entry in listed if entry) if all(listed) else None
    shown = sys.stderr.isatty() if args.progress is None else args.progress
    failed = warned = 0
    reports = []
    with Progress(total, "sample", shown) as progress:
        for url, place, expected in zip(urls, places, listed):
            progress.describe(shard_name(url))
            report = check_shard(url, expected, not args.no_images, progress)
            if place in entries and expected is None:
                report.problems.append("not listed in the manifest")
            failed += bool(report.problems)
            reports.append(report)
            warned += sum(report.warnings.values())
            progress.write(f"{'FAIL' if report.problems else 'ok  '} {url}")
            for line in report.lines():
                progress.write(f"     {line}")
    checked = _checked(manifest_url, bool(found), not args.no_images, reports)
    notes = f"; {warned} decoder warning{'s' if warned != 1 else ''}" if warned else ""
    print(f"{len(urls) - failed} of {len(urls)} shards ok: {checked}{notes}")
    return 1 if failed else 0
