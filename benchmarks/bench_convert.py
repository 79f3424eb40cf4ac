"""Conversion speed and memory: ``wdsx convert`` (1 and 2 workers) against a plain webdataset
``ShardWriter`` loop, on Fashion-MNIST image folders of two sizes.

Every conversion runs in its own subprocess, which reports the wall time of the conversion
(after interpreter start and imports) and its peak RSS (its own, and the largest of its worker
processes, from ``getrusage``). Each configuration runs
``repeats`` times, interleaved, on a warm page cache; the table shows medians. Note that
``wdsx convert`` also checks every image (PIL header parse) while the baseline only copies bytes.

    python benchmarks/bench_convert.py [--sizes 2500 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from make_mini_dataset import write_subset  # noqa: E402

MAXCOUNT = 1000

_CHILD = r"""
import json, os, resource, sys, time
mode, src, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if mode == "webdataset":
    import webdataset as wds
else:
    import PIL.Image
    from wdsx.commands.cli import main
started = time.perf_counter()  # libraries imported: time the conversion only
if mode == "webdataset":
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    count = 0
    with wds.ShardWriter(os.path.join(out, "train-%06d.tar"), maxcount=MAXCOUNT, verbose=0) as writer:
        for label, name in enumerate(classes):
            for file in sorted(os.listdir(os.path.join(src, name))):
                stem, ext = file.rsplit(".", 1)
                with open(os.path.join(src, name, file), "rb") as f:
                    writer.write({"__key__": f"{name}/{stem}", ext.lower(): f.read(), "cls": label})
                count += 1
else:
    args = ["convert", src, os.path.join(out, "train"), "--maxcount", str(MAXCOUNT), "--quiet"]
    assert main([*args, "--workers", str(workers)]) == 0
seconds = time.perf_counter() - started
# VmHWM, not ru_maxrss: the latter keeps the high-water mark of the parent across fork+exec
peak = int([line for line in open("/proc/self/status") if line.startswith("VmHWM")][0].split()[1])
print(json.dumps({"seconds": seconds, "rss_main_mb": peak / 1024,
                  "rss_worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
""".replace("MAXCOUNT", str(MAXCOUNT))

CONFIGS = (("webdataset ShardWriter loop", "webdataset", 1), ("wdsx convert --workers 1", "wdsx", 1))
CONFIGS += (("wdsx convert --workers 2", "wdsx", 2),)


def _warm(src: Path) -> None:
    for path in src.rglob("*.png"):
        path.read_bytes()


def _measure(mode: str, src: Path, workdir: Path, workers: int) -> dict:
    out = workdir / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    reply = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, str(src), str(out), str(workers)],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(reply.stdout.strip().splitlines()[-1])


def run_benchmark(sizes: tuple[int, ...] = (2500, 10000), repeats: int = 3) -> list[dict]:
    """Median rate and peak RSS of each configuration for each folder size."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="wdsx-bench-") as tmp:
        workdir = Path(tmp)
        for size in sizes:
            src = workdir / f"fashion-{size}"
            write_subset(str(src), split="train", per_class=size // 10)
            _warm(src)
            runs: dict[str, list[dict]] = {label: [] for label, _, _ in CONFIGS}
            for _ in range(repeats):
                for label, mode, workers in CONFIGS:
                    runs[label].append(_measure(mode, src, workdir, workers))
            for label, _, _ in CONFIGS:
                seconds = statistics.median(r["seconds"] for r in runs[label])
                rows.append(
                    {
                        "images": size,
                        "config": label,
                        "images_per_s": size / seconds,
                        "rss_main_mb": statistics.median(r["rss_main_mb"] for r in runs[label]),
                        "rss_worker_mb": statistics.median(r["rss_worker_mb"] for r in runs[label]),
                    }
                )
    return rows


def format_table(rows: list[dict]) -> str:
    """The rows as a text table, with ratios to the webdataset loop and of 2 workers over 1."""
    header = ("images", "configuration", "images/s", "vs wds", "RSS main", "RSS worker")
    lines = ["{:>7}  {:<28} {:>9} {:>7} {:>9} {:>10}".format(*header)]
    by_key = {(r["images"], r["config"]): r for r in rows}
    for row in rows:
        baseline = by_key[(row["images"], CONFIGS[0][0])]["images_per_s"]
        worker = f"{row['rss_worker_mb']:.0f} MB" if row["rss_worker_mb"] else "-"
        lines.append(
            f"{row['images']:>7}  {row['config']:<28} {row['images_per_s']:>9.0f} "
            f"{row['images_per_s'] / baseline:>6.2f}x {row['rss_main_mb']:>6.0f} MB {worker:>10}"
        )
    for size in dict.fromkeys(r["images"] for r in rows):
        one = by_key[(size, CONFIGS[1][0])]["images_per_s"]
        two = by_key[(size, CONFIGS[2][0])]["images_per_s"]
        lines.append(f"{size:>7}  speed-up of 2 workers over 1: {two / one:.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2500, 10000], help="folder sizes (images)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}, maxcount {MAXCOUNT}")
    print(format_table(run_benchmark(tuple(args.sizes), args.repeats)))


if __name__ == "__main__":
    main()
