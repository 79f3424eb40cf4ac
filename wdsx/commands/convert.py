"""``wdsx convert``: an image folder (through :func:`wdsx.write.convert.convert`) or a table of
records (through :func:`wdsx.write.tables.write_table`) to WebDataset shards."""

from __future__ import annotations

import argparse
import os
import sys

from wdsx.core.errors import WriteError
from wdsx.write.convert import (
    REENCODE_FORMATS,
    VERIFY_MODES,
    ConvertReport,
    ConvertSettings,
    convert,
)
from wdsx.write.dataset import WriteReport
from wdsx.write.engines import ENGINES
from wdsx.write.folder import LABEL_MODES
from wdsx.write.tables import TABLE_SUFFIXES, write_table


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
        help="convert an image folder or a table of records (CSV, JSONL, Parquet) into shards",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Convert an image folder or a table into WebDataset shards plus a manifest "
        "(<stem>.manifest.json: sample counts, sizes, SHA-256, class names). An ImageFolder-style "
        "tree (one sub-folder per class) gives samples {<class>/<stem>: original image bytes, cls: "
        "class index}; a folder holding images itself gives unlabeled samples (--labels). A table "
        "(.csv, .jsonl, .parquet) gives one sample per record: the record as json, or the columns "
        "named by --field and --file. The output is byte-identical for any --workers and "
        "--engine; the ranks of a job split the shards across machines, and the last "
        "rank to finish writes the manifest. The rank comes from torch.distributed when it is "
        "initialised, else from the launcher: torchrun (RANK/WORLD_SIZE), SLURM "
        "(SLURM_PROCID/SLURM_NTASKS), Open MPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE) or "
        "MPICH (PMI_RANK/PMI_SIZE). A re-run skips the shards already complete.",
    )
    parser.add_argument("src", help="image folder, or a table: .csv, .jsonl, .parquet")
    parser.add_argument(
        "dest",
        help="shard pattern (out/train-%%06d.tar) or prefix (out/train): local, s3://, gs:// or az://",
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
    parser.add_argument("--workers", type=int, default=1, help="worker processes (local engine)")
    parser.add_argument("--engine", choices=ENGINES, default="local", help="who writes the shards")
    parser.add_argument("--ray-address", help="the Ray cluster (--engine ray; default: RAY_ADDRESS or local)")
    parser.add_argument(
        "--labels", choices=LABEL_MODES, default="auto", help="image folders: class sub-folders or unlabeled"
    )
    parser.add_argument("--key", metavar="COLUMN", help="tables: the column that holds sample keys")
    parser.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="COLUMN=EXT",
        help="tables: store a column as a field (repeatable); default: the record as json",
    )
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="COLUMN=EXT",
        help="tables: read the file a column names (relative to the table) into a field",
    )
    parser.add_argument("--strict", action="store_true", help="fail at the first unreadable image")
    parser.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read symbolic links that lead out of the source folder (left out by default)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    parser.set_defaults(run=run)


def _columns(pairs: list[str]) -> dict[str, str]:
    """``["caption=txt"]`` -> ``{"caption": "txt"}``."""
    columns = {}
    for pair in pairs:
        column, equals, name = pair.partition("=")
        if not equals or not column or not name:
            raise SystemExit(f"wdsx convert: expected COLUMN=EXT, not {pair!r}")
        columns[column] = name
    return columns


def run(args: argparse.Namespace) -> int:
    """``wdsx convert``: convert, then print a summary (skipped inputs on stderr)."""
    table = os.path.isfile(args.src) and args.src.endswith(TABLE_SUFFIXES)
    try:
        report = _write_table(args) if table else _convert_folder(args)
    except WriteError as exn:
        if exn.report is not None:
            _problems(exn.report)
        raise
    _problems(report)
    if not args.quiet:
        _summary(report, "records" if table else "images")
    return 0


def _convert_folder(args: argparse.Namespace) -> WriteReport:
    """An image folder: one sample per image."""
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
    return convert(
        args.src,
        args.dest,
        settings,
        workers=args.workers,
        engine=args.engine,
        ray_address=args.ray_address,
        strict=args.strict,
        progress=not args.quiet and sys.stderr.isatty(),
        follow_symlinks=args.follow_symlinks,
        labels=args.labels,
    )


def _write_table(args: argparse.Namespace) -> WriteReport:
    """A table: one sample per record."""
    return write_table(
        args.src,
        args.dest,
        key=args.key,
        fields=_columns(args.field),
        files=_columns(args.file),
        maxcount=args.maxcount,
        maxsize=args.maxsize,
        shuffle=args.shuffle,
        seed=args.seed,
        engine=args.engine,
        workers=args.workers,
        ray_address=args.ray_address,
        strict=args.strict,
        progress=not args.quiet and sys.stderr.isatty(),
    )


def _summary(report: WriteReport, unit: str) -> None:
    rate = report.samples_written / report.seconds if report.seconds else 0.0
    print(
        f"{report.written + report.reused} of {report.shards} shards complete "
        f"({report.written} written now, {report.reused} before): "
        f"{report.samples} {unit}, {len(report.skipped)} skipped, {len(report.warnings)} warnings; "
        f"{report.samples_written} {unit} in {report.seconds:.1f} s ({rate:.0f} {unit}/s)"
    )
    print(f"manifest: {report.manifest_url or 'pending: the last rank to finish writes it'}")
    if report.removed:
        print(f"removed {len(report.removed)} shards that an earlier plan wrote here and this one does not")


def _problems(report: WriteReport) -> None:
    """Print, on stderr, each input left out and each warning, by path (images: below the
    source folder) or record."""
    folder = report.src if isinstance(report, ConvertReport) else ""
    for name, reason in report.skipped:
        print(f"skipped {os.path.join(folder, name)}: {reason}", file=sys.stderr)
    for name, message in report.warnings:
        print(f"warning {os.path.join(folder, name)}: {message}", file=sys.stderr)
    for url in report.left:
        print(f"warning {url}: left by an earlier plan, not part of this dataset: remove it", file=sys.stderr)
