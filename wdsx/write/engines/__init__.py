"""Engines that run a plan's shard jobs: local processes (:mod:`.local`, the default, also
under a launcher that splits the jobs by rank) and a Ray cluster (:mod:`.ray`). Every engine
gets the same jobs and writes the same bytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from wdsx.write.engines.local import Task, run_locally
from wdsx.write.plan import ShardJob

__all__ = ["ENGINES", "run_jobs"]

ENGINES = ("local", "ray")


def run_jobs(
    engine: str,
    jobs: Sequence[ShardJob],
    task: Task,
    *,
    workers: int = 1,
    ray_address: str | None = None,
    progress: Callable[[int], object] = lambda n: None,
) -> list[dict[str, Any]]:
    """Run the jobs on ``engine``; returns their completion records."""
    if engine == "local":
        return run_locally(jobs, task, workers=workers, progress=progress)
    if engine == "ray":
        from wdsx.write.engines.ray import run_on_ray

        return run_on_ray(jobs, task, address=ray_address, progress=progress)
    raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
