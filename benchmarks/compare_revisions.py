"""This checkout's read throughput against another git revision of wdsx, in one run.

A restructuring must not cost speed; on a shared, noisy machine the only honest check is both
versions measured alternately in the same run. The other revision is exported with
``git archive`` into a temporary folder; every measurement runs in a fresh interpreter whose
``PYTHONPATH`` picks the version, and only the iteration is timed.

    python benchmarks/compare_revisions.py REV [--repeats 5] [--instructions]

``--instructions`` counts instead the machine instructions one pass of each raw-reading
pipeline executes per sample, under valgrind's callgrind (one pass is the difference between a
run of two passes and a run of one): a figure that a busy machine cannot move, for changes
smaller than its noise. It needs ``valgrind`` (Debian package ``valgrind``) and a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import data  # noqa: E402
from benchmarks.run import READ_PIPELINES  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

MEASURE = """
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import wdsx
from benchmarks import bench_read
build = getattr(bench_read, {builder!r})
urls = {urls!r}
for _ in range({passes}):
    start = time.perf_counter()
    count = bench_read.count_samples(build(wdsx, urls), {batched!r})
    seconds = time.perf_counter() - start
print(json.dumps({{"rate": count / seconds, "count": count, "file": wdsx.__file__}}))
"""
"""Runs a pipeline ``passes`` times in a fresh interpreter; prints the last pass's rate, its
sample count and which wdsx was measured."""


def export(revision: str, folder: str) -> str:
    """The package and benchmarks of ``revision``, unpacked into ``folder``."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", revision, "wdsx", "benchmarks"], capture_output=True, check=True
    ).stdout
    path = os.path.join(folder, "tree.tar")
    with open(path, "wb") as stream:
        stream.write(archive)
    with tarfile.open(path) as tree:
        tree.extractall(folder, filter="data")
    return folder


def measure(
    tree: str, builder: str, urls: list[str], batched: bool, passes: int = 1, prefix: Sequence[str] = ()
) -> tuple[dict[str, Any], str]:
    """:data:`MEASURE` run with ``tree``'s wdsx (under the command ``prefix``, if any): its
    result and its standard error."""
    code = MEASURE.format(
        builder=builder, urls=[os.path.abspath(url) for url in urls], batched=batched, passes=passes
    )
    # run in the tree: ``python -c`` puts the working directory first on sys.path; one string
    # hash seed for every run, so that dictionaries are laid out (and counted) alike
    env = dict(os.environ, PYTHONPATH=tree, PYTHONHASHSEED="0")
    done = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=tree
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(tree), f"measured {result['file']}, not the tree under {tree}"
    return result, done.stderr


def rate(tree: str, builder: str, urls: list[str], batched: bool) -> float:
    return float(measure(tree, builder, urls, batched)[0]["rate"])


def instructions_per_sample(tree: str, builder: str, urls: list[str], batched: bool) -> float:
    """Instructions one pass of the pipeline executes per sample, counted by callgrind."""
    totals, count = [], 0
    for passes in (1, 2):
        result, errors = measure(
            tree,
            builder,
            urls,
            batched,
            passes,
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"],
        )
        found = re.search(r"Collected : (\d+)", errors)
        assert found, f"no instruction count in valgrind's output:\n{errors[-2000:]}"
        totals.append(int(found.group(1)))
        count = result["count"]
    return (totals[1] - totals[0]) / count


def compare_instructions(trees: dict[str, str], shards: dict[str, list[str]]) -> None:
    print(f"| pipeline (instructions per sample) | {' | '.join(trees)} | ratio |\n|---|---|---|---|")
    for name, build, which, batched, _ in READ_PIPELINES:
        if build.__name__ != "raw":  # decoding rows would spend hours in libjpeg under valgrind
            continue
        new, old = (
            instructions_per_sample(tree, build.__name__, shards[which], batched) for tree in trees.values()
        )
        print(f"| {name} | {new:,.0f} | {old:,.0f} | {new / old:.3f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="count instructions per sample instead")
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        sys.exit("--instructions needs valgrind (apt-get install valgrind)")
    shards = {"tiny": data.tiny_shards(), "jpeg": data.jpeg_shards()}
    with tempfile.TemporaryDirectory() as folder:
        trees = {"this checkout": ROOT, args.revision: export(args.revision, folder)}
        if args.instructions:
            compare_instructions(trees, shards)
            return
        print(f"| pipeline | this checkout | {args.revision} | ratio |\n|---|---|---|---|")
        for name, build, which, batched, _ in READ_PIPELINES:
            rates: dict[str, list[float]] = {label: [] for label in trees}
            for _ in range(args.repeats):
                for label, tree in trees.items():
                    rates[label].append(rate(tree, build.__name__, shards[which], batched))
            new, old = (statistics.median(rates[label]) for label in trees)
            print(f"| {name} | {new:,.0f} /s | {old:,.0f} /s | {new / old:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
