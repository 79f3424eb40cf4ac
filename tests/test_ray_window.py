"""How the Ray engine submits its jobs: a window of them at a time, none after a job fails.

Run against a stand-in for Ray's task API that runs each task when the driver asks for its
result, and finishes them oldest first; the engine on a real Ray cluster is tested in
test_ray_writer.py. The oracle here is the stand-in's own count of what was submitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from wdsx.write.engines import ray as ray_engine
from wdsx.write.plan import ShardJob


class ScriptedRay:
    """``ray.remote``, ``put``, ``wait``, ``get`` and ``cluster_resources``, over a cluster of
    ``cpus`` that finishes one task, the oldest, each time the driver waits."""

    def __init__(self, cpus: int):
        self.cpus = cpus
        self.submitted: list[ShardJob] = []
        self.finished: set[int] = set()
        self.most_in_flight = 0

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": float(self.cpus)}

    def put(self, value: Any) -> Any:
        return value

    def remote(self, **options: Any) -> Callable[[Callable], Any]:
        def wrap(body: Callable) -> Any:
            scripted = self

            class Remote:
                @staticmethod
                def remote(task: Any, job: ShardJob) -> tuple[int, Callable[[], Any]]:
                    scripted.submitted.append(job)
                    in_flight = len(scripted.submitted) - len(scripted.finished)
                    scripted.most_in_flight = max(scripted.most_in_flight, in_flight)
                    return len(scripted.submitted) - 1, lambda: body(task, job)

            return Remote

        return wrap

    def wait(self, refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        unfinished = [ref for ref in refs if ref[0] not in self.finished]
        if unfinished and timeout > 0:
            self.finished.add(min(unfinished)[0])
        done = [ref for ref in refs if ref[0] in self.finished][:num_returns]
        return done, [ref for ref in refs if ref not in done]

    def get(self, ref: tuple[int, Callable[[], Any]]) -> Any:
        return ref[1]()


def jobs(count: int) -> list[ShardJob]:
    return [ShardJob(number, f"s-{number}.tar", ((number, number),), "plan") for number in range(count)]


def record(job: ShardJob, progress: Callable[[int], object]) -> dict[str, Any]:
    if job.number == 5:
        raise ValueError("job 5 fails")
    return {"shard": job.number}


@pytest.mark.parametrize("cpus, window", [(1, 16), (4, 16), (20, 40)])
def test_jobs_are_submitted_a_window_at_a_time(monkeypatch, cpus: int, window: int):
    scripted = ScriptedRay(cpus)
    monkeypatch.setattr(ray_engine, "import_ray", lambda: scripted)
    done: list[int] = []
    task = lambda job, progress: {"shard": job.number}  # noqa: E731
    records = ray_engine.run_on_ray(jobs(100), task, progress=done.append)
    assert [item["shard"] for item in records] == list(range(100))
    assert scripted.most_in_flight == window and sum(done) == 100


def test_no_job_is_submitted_after_one_fails(monkeypatch):
    scripted = ScriptedRay(4)
    monkeypatch.setattr(ray_engine, "import_ray", lambda: scripted)
    with pytest.raises(ValueError, match="job 5 fails"):
        ray_engine.run_on_ray(jobs(100), record)
    # jobs 0-4 finished, each making room for one more; job 5 failed, and nothing came after
    assert len(scripted.submitted) == 16 + 5
