"""The local engine: shard jobs in this process, or in a pool of worker processes on this
machine, with a progress count shared by all of them."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from wdsx.write.plan import ShardJob

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

__all__ = ["run_locally"]

Task = Callable[[ShardJob, Callable[[int], object]], dict[str, Any]]
"""Writes one shard job, reporting inputs done through its second argument; returns the record."""

_worker_task: Task | None = None
_worker_counter: Synchronized[int] | None = None
"""In a pool worker: the task, and the inputs done by all workers (shared with the parent)."""


def _init_worker(task: Task, counter: Synchronized[int]) -> None:
    """Pool initializer: keep the task and the shared counter (sent once per worker)."""
    global _worker_task, _worker_counter
    _worker_task, _worker_counter = task, counter


def _count(n: int) -> None:
    counter = _worker_counter
    assert counter is not None, "only pool workers, set up by _init_worker, count"
    with counter.get_lock():
        counter.value += n


def _job_in_worker(job: ShardJob) -> dict[str, Any]:
    assert _worker_task is not None, "only pool workers, set up by _init_worker, run jobs"
    return _worker_task(job, _count)


def run_locally(
    jobs: Sequence[ShardJob],
    task: Task,
    *,
    workers: int = 1,
    progress: Callable[[int], object] = lambda n: None,
) -> list[dict[str, Any]]:
    """Run ``task`` on every job, here (``workers`` <= 1) or in ``workers`` processes; returns
    the records in the order the jobs finished."""
    if workers <= 1 or len(jobs) <= 1:
        return [task(job, progress) for job in jobs]
    context = multiprocessing.get_context()
    counter = context.Value("q", 0)
    records: list[dict[str, Any]] = []
    with context.Pool(min(workers, len(jobs)), _init_worker, (task, counter)) as pool:
        results = pool.imap_unordered(_job_in_worker, jobs)
        shown = 0
        while len(records) < len(jobs):
            try:
                records.append(results.next(timeout=0.2))
            except multiprocessing.TimeoutError:
                pass
            done = counter.value
            progress(done - shown)
            shown = done
    return records
