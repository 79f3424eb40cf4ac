"""What running a shard job on Ray costs: the same tiny jobs (one one-field sample each) run in
this process and as Ray tasks on the two-node test cluster (one CPU per node), in seconds per
job. The jobs do almost nothing but write their shard and record (each fsynced), so the Ray
figure is the engine's own cost per shard: scheduling the task, sending the job and the
record back; with two one-CPU nodes, two jobs run at a time. Then a real conversion (the
shipped 2,000-image folder, 20 shards) with two local worker processes against the cluster.

    python -m benchmarks.bench_ray OUT_DIR
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from tests.fixtures.raycluster import ray_cluster
from tests.fixtures.rayjobs import tiny_sample
from wdsx.write.convert import ConvertSettings, convert
from wdsx.write.engines.local import run_locally
from wdsx.write.engines.ray import import_ray, run_on_ray
from wdsx.write.jobs import JobRunner
from wdsx.write.plan import plan_writes

JOBS = 40
IMAGES = os.path.join(os.path.dirname(__file__), "..", "data", "fashion-mnist-mini")
"""The shipped image folder (2,000 PNGs) that the conversion comparison converts."""


def _seconds_per_job(run: Any, out_dir: str, name: str) -> float:
    """Seconds per job for ``run(jobs, task)`` over :data:`JOBS` one-input jobs into a fresh
    directory."""
    jobs = plan_writes(list(range(JOBS)), os.path.join(out_dir, name, "t-%06d.tar"), maxcount=1).jobs
    started = time.perf_counter()
    records = run(jobs, JobRunner(tiny_sample))
    assert len(records) == JOBS
    return (time.perf_counter() - started) / JOBS


def _images_per_s(out_dir: str, name: str, **engine: Any) -> float:
    """Images per second converting the shipped image folder into shards of 100."""
    dest = os.path.join(out_dir, name, "f-%06d.tar")
    report = convert(IMAGES, dest, ConvertSettings(maxcount=100), **engine)
    return report.samples_written / report.seconds


def run(out_dir: str, repeats: int = 3) -> dict[str, float]:
    """Seconds per job in this process, then on Ray: the first round (workers starting) and
    later rounds (workers warm), medians of ``repeats`` rounds; also seconds to connect."""
    ray = import_ray()
    local = [_seconds_per_job(run_locally, out_dir, f"local{n}") for n in range(repeats)]
    found = {"jobs": float(JOBS), "in_process_s_per_job": statistics.median(local)}
    with ray_cluster() as cluster:
        started = time.perf_counter()
        ray.init(address=cluster.address)
        found["ray_connect_s"] = time.perf_counter() - started
        try:
            found["ray_first_round_s_per_job"] = _seconds_per_job(run_on_ray, out_dir, "ray")
            warm = [_seconds_per_job(run_on_ray, out_dir, f"ray{n}") for n in range(repeats)]
            found["ray_warm_s_per_job"] = statistics.median(warm)
            rates: dict[str, list[float]] = {"local": [], "ray": []}
            for n in range(repeats):  # interleaved: the machine's load changes
                rates["local"].append(_images_per_s(out_dir, f"convert-local{n}", workers=2))
                rates["ray"].append(_images_per_s(out_dir, f"convert-ray{n}", engine="ray"))
            found["convert_local_2_workers_img_per_s"] = statistics.median(rates["local"])
            found["convert_ray_img_per_s"] = statistics.median(rates["ray"])
        finally:
            ray.shutdown()
    return found


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1]), indent=2))
