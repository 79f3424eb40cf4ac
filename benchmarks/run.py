"""``make bench``: wdsx against webdataset 1.0.2 on the same generated shards, in one run.

Prints a table of rates and ratios (medians of interleaved runs: this machine is shared and
noisy, so only same-run ratios mean anything) and writes it to ``bench-out/results.md`` and
``results.json``. A dated copy, ``benchmarks/results/YYYY-MM-DD.json``, is what the documentation's
performance page renders its tables and plots from; commit it to publish a run.

    python benchmarks/run.py [--only read,loader,resume,s3,convert,formats,pack,peers] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import bench_read, bench_resume, data  # noqa: E402

Row = tuple[str, str, str, str, str]


def fmt(value: float, unit: str = "") -> str:
    if value >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}"


def ratio_row(name: str, rates: dict[str, float], target: str, unit: str = " /s") -> Row:
    ratio = rates["wdsx"] / rates["webdataset"]
    return (name, fmt(rates["wdsx"], unit), fmt(rates["webdataset"], unit), f"{ratio:.2f}x", target)


READ_PIPELINES = (
    # (row name, pipeline builder, shard set, yields batches, target)
    ("raw iteration, 100k x ~100 B samples", bench_read.raw, "tiny", False, ">= 10x"),
    ("raw iteration, 20k x ~24 KB JPEG samples", bench_read.raw, "jpeg", False, ">= 5x"),
    ('decode("rgb8").to_tuple("jpg", "cls")', bench_read.decoded, "jpeg", False, ">= 1.5x"),
    ("... + shuffle(1000).batched(64)", bench_read.shuffled_batches, "jpeg", True, ">= 1.8x"),
)


def read_section(repeats: int) -> list[Row]:
    shards = {"tiny": data.tiny_shards(), "jpeg": data.jpeg_shards()}
    tiny, jpeg = shards["tiny"], shards["jpeg"]
    rows = [
        ratio_row(name, bench_read.rates(build, shards[which], batched, repeats), target)
        for name, build, which, batched, target in READ_PIPELINES
    ]
    calls = bench_read.python_calls_per_sample(tiny)
    rows.append(
        (
            "Python calls per sample, raw tiny",
            f"{calls['wdsx']:.1f}",
            f"{calls['webdataset']:.1f}",
            f"{calls['webdataset'] / calls['wdsx']:.1f}x fewer",
            "<= 20",
        )
    )
    rss = bench_read.peak_rss_mb(jpeg)
    rows.append(
        (
            "peak RSS, raw JPEG iteration",
            f"{rss['wdsx']:.0f} MB",
            f"{rss['webdataset']:.0f} MB",
            f"{rss['wdsx'] / rss['webdataset']:.2f}x",
            "<= 1x",
        )
    )
    return rows


def resume_section() -> list[Row]:
    url = data.big_shard()
    size = os.path.getsize(url) / 1e6
    latency = bench_resume.resume_latency(url, 20_000)
    state = bench_resume.state_size(data.jpeg_shards())
    return [
        (
            f"first batch after resume at 10% / 90% of a {size:.0f} MB shard",
            f"{latency['ttfb_10'] * 1000:.0f} / {latency['ttfb_90'] * 1000:.0f} ms",
            f"{latency['skip_10'] * 1000:.0f} / {latency['skip_90'] * 1000:.0f} ms (skip)",
            f"90%/10% = {latency['ratio']:.2f}",
            "<= 1.2",
        ),
        ("state size, shuffle(1000), 2 workers", f"{state['compact_bytes']:,} B", "no state", "", "small"),
    ]


def s3_section() -> list[Row]:
    from benchmarks.bench_s3 import bench_s3_table, bench_stores_table

    shards = data.jpeg_shards()[:8]
    return bench_s3_table(shards) + bench_stores_table(shards)


def convert_section() -> list[Row]:
    from benchmarks.bench_convert import CONFIGS, run_benchmark

    baseline, one, two = (label for label, _, _ in CONFIGS)
    table: dict[int, dict[str, dict]] = {}
    for row in run_benchmark(sizes=(5000, 20000), repeats=3):
        table.setdefault(row["images"], {})[row["config"]] = row
    rows: list[Row] = []
    for size, measured in table.items():
        loop, single, double = (measured[label]["images_per_s"] for label in (baseline, one, two))
        rows.append(
            (
                f"convert {size:,} images, --workers 1 / 2 (webdataset: a ShardWriter loop)",
                f"{single:,.0f} / {double:,.0f} img/s",
                f"{loop:,.0f} img/s",
                f"{single / loop:.2f}x / {double / loop:.2f}x; 2 vs 1 worker: {double / single:.2f}x",
                "",
            )
        )
        rows.append(
            (
                f"convert {size:,} images, peak RSS (main / each worker)",
                f"{measured[two]['rss_main_mb']:.0f} / {measured[two]['rss_worker_mb']:.0f} MB",
                f"{measured[baseline]['rss_main_mb']:.0f} MB",
                "",
                "flat in folder size",
            )
        )
    return rows + ray_rows()


def ray_rows() -> list[Row]:
    """Ray against local processes on this machine: a conversion, and the cost of one shard job."""
    import tempfile

    from benchmarks.bench_ray import run as ray_run

    with tempfile.TemporaryDirectory() as out:
        found = ray_run(out)
    local, ray = found["convert_local_2_workers_img_per_s"], found["convert_ray_img_per_s"]
    per_job = found["ray_warm_s_per_job"] - found["in_process_s_per_job"]
    return [
        (
            "convert 2,000 images: Ray (2 one-CPU nodes) / local (2 worker processes)",
            f"{ray:,.0f} / {local:,.0f} img/s",
            "",
            f"Ray {ray / local:.2f}x local",
            "",
        ),
        (
            "Ray's cost per shard job (warm workers, over writing in-process)",
            f"{per_job * 1000:.1f} ms",
            "",
            f"cold workers: {found['ray_first_round_s_per_job'] * 1000:.0f} ms/job",
            "",
        ),
    ]


def formats_section() -> list[Row]:
    from benchmarks.bench_formats import formats_table

    return formats_table()


def pack_section() -> list[Row]:
    """Sequence packing: tokens/s of each strategy beside a NumPy reference packing the same
    documents (in the webdataset column)."""
    from benchmarks.bench_pack import pack_table

    return pack_table()


def loader_section(repeats: int) -> list[Row]:
    """WebLoader pipelines: wdsx, webdataset and the bound (the decoder alone) in one run."""
    from benchmarks.bench_gil import gil_rows
    from benchmarks.bench_loader import loader_rows
    from benchmarks.bench_scaled import scaled_rows

    return loader_rows(repeats) + scaled_rows() + gil_rows()


def peers_section() -> list[Row]:
    """litdata, Mosaic Streaming and torchdata.nodes beside wdsx and webdataset, each in its own
    format, on 20,000 JPEGs, 5 interleaved rounds (a smoke run: ``bench_peers.py --samples 2000``)."""
    from benchmarks.bench_peers import peer_rows

    return peer_rows(samples=20_000, repeats=5)


SECTIONS = {
    "read": read_section,
    "loader": loader_section,
    "resume": resume_section,
    "s3": s3_section,
    "convert": convert_section,
    "formats": formats_section,
    "pack": pack_section,
    "peers": peers_section,
}


def render(rows: list[Row]) -> str:
    header = ("benchmark", "wdsx", "webdataset", "ratio", "target")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    measured: dict[str, list[Row]] = {}
    for name in args.only.split(","):
        section = SECTIONS[name]
        print(f"# running {name} benchmarks...", file=sys.stderr, flush=True)
        measured[name] = section(args.repeats) if name in ("read", "loader") else section()
        save(measured)  # what is measured so far survives a later section's failure
    print(render([row for rows in measured.values() for row in rows]))


def save(measured: dict[str, list[Row]]) -> None:
    """Write the table so far to ``bench-out/results.md`` and ``results.json``, and the dated copy
    with the machine it ran on to ``benchmarks/results/``: there, the sections run now replace
    their rows of an earlier run the same day, and the other sections' rows stay, each row
    with the commit it was measured at."""
    rows = [row for section_rows in measured.values() for row in section_rows]
    os.makedirs(data.ROOT, exist_ok=True)
    with open(os.path.join(data.ROOT, "results.md"), "w") as stream:
        stream.write(render(rows) + "\n")
    with open(os.path.join(data.ROOT, "results.json"), "w") as stream:
        json.dump(rows, stream, indent=1)
    today = datetime.date.today().isoformat()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{today}.json")
    commit = _git_commit()  # before the result file changes, which would make the checkout dirty
    kept = [row for row in _earlier_rows(path) if row.get("section") not in measured]
    new = [
        {**dict(zip(COLUMNS, row)), "section": name, "commit": commit}
        for name, rows in measured.items()
        for row in rows
    ]
    order = {name: number for number, name in enumerate(SECTIONS)}
    by_section = sorted(kept + new, key=lambda row: order.get(row["section"], 0))
    record = dated_record(today, commit, by_section)
    with open(path, "w") as stream:
        json.dump(record, stream, indent=1)
        stream.write("\n")


def _earlier_rows(path: str) -> list[dict]:
    """The rows of an earlier run saved at ``path`` today, if they say their section (rows of
    an older format are replaced whole)."""
    try:
        with open(path) as stream:
            rows = json.load(stream).get("rows", [])
    except (OSError, ValueError):
        return []
    return rows if all("section" in row for row in rows) else []


RESULTS_DIR = os.path.join(os.path.dirname(__file__), "results")
COLUMNS = ("benchmark", "wdsx", "webdataset", "ratio", "target")


def dated_record(today: str, commit: str, rows: list[dict]) -> dict:
    """One day's runs as the docs read them: when, on what, the commit of the latest run, and
    the table's rows by column, each with its section and the commit it was measured at."""
    return {
        "date": today,
        "commit": commit,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "rows": rows,
    }


def _git_commit() -> str:
    """The checked-out commit (with ``+dirty`` for local changes), or "" outside a git checkout."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], capture_output=True, text=True, check=False, cwd=RESULTS_DIR)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if commit and git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return commit


if __name__ == "__main__":
    main()
