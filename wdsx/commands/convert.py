"""``wdsx convert``: an image folder to WebDataset shards, through :func:`wdsx.write.convert.convert`."""

from __future__ import annotations

import argparse
import os
import sys

from wdsx.write.convert import (
    REENCODE_FORMATS,
    VERIFY_MODES,
    ConvertError,
    ConvertReport,
    ConvertSettings,
    convert,
)


def parse_size(text: str) -> float:
    """Bytes from ``"1e9"``, ``"500MB"``, ``"1.5GiB"``, ``"64k"``... (an argparse ``type``)."""
    units = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
    units |= {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
    lowered = text.strip().lower().removesuffix("b")
    number = lowered.rstrip("kmgti")
    unit = lowered[len(number) :]
    if unit not in units:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    try:
        return float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``wdsx convert``."""
    defaults = ConvertSettings()
    parser = subparsers.add_parser(
        "convert",
        help="convert an image folder (one sub-folder per class) into shards",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Convert an ImageFolder-style tree into WebDataset shards plus a manifest "
        "(<stem>.manifest.json: sample counts, sizes, SHA-256, class names). Samples are "
        "{<class>/<stem>: original image bytes, cls: class index}. The output is byte-identical "
        "for any --workers; the ranks of a job split the shards across machines, and the last "
        "rank to finish writes the manifest. The rank comes from torch.distributed when it is "
        "initialised, else from the launcher: torchrun (RANK/WORLD_SIZE), SLURM "
        "(SLURM_PROCID/SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) or "
        "MPICH (PMI_RANK/PMI_SIZE). A re-run skips the shards already complete.",
    )
    parser.add_argument("src", help="image folder: one sub-folder per class")
    parser.add_argument(
        "dest", help="shard pattern (out/train-%%06d.tar) or prefix (out/train), local or s3://"
    )
    parser.add_argument("--maxcount", type=int, default=defaults.maxcount, help="samples per shard at most")
    parser.add_argument(
        "--maxsize",
        type=parse_size,
        default=defaults.maxsize,
        help="payload bytes per shard: 1e9, 500MB, 1GiB",
    )
    parser.add_argument("--shuffle", action="store_true", help="shuffle the sample order (seeded)")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed for --shuffle")
    parser.add_argument("--reencode", choices=sorted(REENCODE_FORMATS), help="re-encode every image")
    parser.add_argument("--quality", type=int, default=defaults.quality, help="JPEG/WebP re-encoding quality")
    parser.add_argument("--resize", type=int, metavar="N", help="shrink shorter sides above N to N")
    parser.add_argument(
        "--verify", choices=VERIFY_MODES, default=defaults.verify, help="check of kept images: cheap, or full"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--strict", action="store_true", help="fail at the first unreadable image")
    parser.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read symbolic links that lead out of the source folder (left out by default)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """``wdsx convert``: convert, then print a summary (skipped images on stderr)."""
    settings = ConvertSettings(
        maxcount=args.maxcount,
        maxsize=args.maxsize,
        shuffle=args.shuffle,
        seed=args.seed,
        reencode=args.reencode,
        quality=args.quality,
        resize=args.resize,
        verify=args.verify,
    )
    progress = not args.quiet and sys.stderr.isatty()
    try:
        report = convert(
            args.src,
            args.dest,
            settings,
            workers=args.workers,
            strict=args.strict,
            progress=progress,
            follow_symlinks=args.follow_symlinks,
        )
    except ConvertError as exn:
        if exn.report is not None:
            _problems(exn.report)
        raise
    _problems(report)
    if not args.quiet:
        rate = report.samples_written / report.seconds if report.seconds else 0.0
        print(
            f"{report.written + report.reused} of {report.shards} shards complete "
            f"({report.written} written now, {report.reused} before): "
            f"{report.samples} images, {len(report.skipped)} skipped, {len(report.warnings)} warnings; "
            f"{report.samples_written} images in {report.seconds:.1f} s ({rate:.0f} images/s)"
        )
        print(f"manifest: {report.manifest_url or 'pending: the last rank to finish writes it'}")
    return 0


def _problems(report: ConvertReport) -> None:
    """Print, on stderr, each image left out and each decoder warning, by path."""
    for path, reason in report.skipped:
        print(f"skipped {os.path.join(report.src, path)}: {reason}", file=sys.stderr)
    for path, message in report.warnings:
        print(f"warning {os.path.join(report.src, path)}: {message}", file=sys.stderr)
