"""This checkout's read throughput against another git revision of wdsx, in one run.

A restructuring must not cost speed; on a shared, noisy machine the only honest check is both
versions measured alternately in the same run. The other revision is exported with
``git archive`` into a temporary folder; every measurement runs in a fresh interpreter whose
``PYTHONPATH`` picks the version, and only the iteration is timed.

    python benchmarks/compare_revisions.py REV [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

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
start = time.perf_counter()
count = bench_read.count_samples(build(wdsx, urls), {batched!r})
print(json.dumps({{"rate": count / (time.perf_counter() - start), "file": wdsx.__file__}}))
"""


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


def rate(tree: str, builder: str, urls: list[str], batched: bool) -> float:
    code = MEASURE.format(builder=builder, urls=[os.path.abspath(url) for url in urls], batched=batched)
    env = dict(os.environ, PYTHONPATH=tree)
    # run in the tree: ``python -c`` puts the working directory first on sys.path
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=tree
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(tree), f"measured {result['file']}, not the tree under {tree}"
    return float(result["rate"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    shards = {"tiny": data.tiny_shards(), "jpeg": data.jpeg_shards()}
    print(f"| pipeline | this checkout | {args.revision} | ratio |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        trees = {"this checkout": ROOT, args.revision: export(args.revision, folder)}
        for name, build, which, batched, _ in READ_PIPELINES:
            rates: dict[str, list[float]] = {label: [] for label in trees}
            for _ in range(args.repeats):
                for label, tree in trees.items():
                    rates[label].append(rate(tree, build.__name__, shards[which], batched))
            new, old = (statistics.median(rates[label]) for label in trees)
            print(f"| {name} | {new:,.0f} /s | {old:,.0f} /s | {new / old:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
