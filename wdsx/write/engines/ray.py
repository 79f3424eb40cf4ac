"""The Ray engine: each shard job is one Ray task on a cluster, its record sent back to the driver.

A job writes its shard itself, from the Ray worker that runs it, so the shard URLs must be
reachable from every node: on a multi-node cluster a local path must be on a filesystem that
every node mounts at the same place (NFS, a parallel filesystem), or use an object store URL.
The sample function is pickled by reference when it is defined in a module, so that module must
be importable on the workers (installed there, on their ``PYTHONPATH``, or shipped with Ray's
``runtime_env``).

A task whose worker dies (killed, out of memory, its node lost) is run again, up to
``max_retries`` times; the shard it was writing never appears half-written, since shards are
written to a hidden partial file and renamed when complete. An exception raised by the job
itself is not retried: it reaches the caller at once. The driver keeps only a window of jobs
submitted (twice the cluster's CPUs, at least 16), so the jobs after that window never start;
those already running are left to finish, and their shards are whole, so a rerun keeps them.
They are not cancelled, because cancelling a Ray task while its reply is on the way can abort
the driver inside Ray (a race in Ray's task manager). When ``run_on_ray`` connected to Ray
itself, disconnecting ends them with the job.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from wdsx.core.extras import install_hint
from wdsx.write.engines.local import Task
from wdsx.write.plan import ShardJob

__all__ = ["import_ray", "run_on_ray"]

_POLL_SECONDS = 0.2
"""How often the driver collects finished jobs (and reports progress) while jobs run."""

_MIN_WINDOW = 16
"""Jobs kept submitted at least, whatever the cluster's size."""


def import_ray(purpose: str = "the Ray engine") -> Any:
    """The ``ray`` module, or an ImportError that says how to install it (the ``ray`` extra)."""
    try:
        import ray
    except ImportError as exn:
        raise ImportError(f"{purpose} needs Ray: {install_hint('ray', 'ray[data] pyarrow')} ({exn})") from exn
    return ray


def _run_job(task: Task, job: ShardJob) -> dict[str, Any]:
    """The body of one Ray task (inputs-done counts stay on the worker: the driver counts a
    job's inputs when its record arrives)."""
    return task(job, lambda n: None)


def run_on_ray(
    jobs: Sequence[ShardJob],
    task: Task,
    *,
    address: str | None = None,
    progress: Callable[[int], object] = lambda n: None,
    max_retries: int = 3,
) -> list[dict[str, Any]]:
    """Run ``task`` on every job as a Ray task; returns the records in the order jobs finished.

    Uses the Ray this process is already connected to; otherwise connects with
    ``ray.init(address=address)`` (None: the ``RAY_ADDRESS`` environment variable, or a new
    local Ray) and disconnects at the end, leaving alone a Ray the caller started.
    ``progress(n)`` is called with the number of inputs of each job as it finishes.
    """
    ray = import_ray()
    if not jobs:
        return []
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address)
    try:
        remote_job = ray.remote(max_retries=max_retries, retry_exceptions=False)(_run_job)
        task_ref = ray.put(task)
        window = max(_MIN_WINDOW, 2 * int(ray.cluster_resources().get("CPU", 1)))
        waiting = iter(jobs)
        running: dict[Any, ShardJob] = {}
        records: list[dict[str, Any]] = []
        while True:
            for job in itertools.islice(waiting, window - len(running)):
                running[remote_job.remote(task_ref, job)] = job
            if not running:
                return records
            # the first job to finish, or none within _POLL_SECONDS; then every other finished one
            done, rest = ray.wait(list(running), num_returns=1, timeout=_POLL_SECONDS)
            if done and rest:
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in done:
                records.append(ray.get(ref))  # a job's own error: raised here, to the caller
                progress(len(running.pop(ref).inputs))
    finally:
        if started_here:
            ray.shutdown()
