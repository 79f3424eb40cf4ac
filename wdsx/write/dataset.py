"""Write any samples as shards: a list of inputs, a function from one input to samples, and a
destination; the result is a sharded dataset with a manifest, the same bytes whoever runs it.

The inputs are cut into shards before anything runs (:mod:`wdsx.write.plan`), so each shard
is an independent job that any engine can run (:mod:`wdsx.write.engines`): processes on this
machine, the ranks of a launcher (shard ``i`` belongs to rank ``i % world_size``), or the tasks
of a Ray cluster. Shards are written atomically and followed by completion records
(:mod:`wdsx.write.jobs`); a re-run of the same plan writes only the shards not yet complete;
whoever completes the last shard merges the records into the manifest
(:mod:`wdsx.write.records`) and removes the shards an earlier plan wrote there that this one
does not (:mod:`wdsx.write.stale`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wdsx.core import topology
from wdsx.read.manifest import natural_key
from wdsx.sources import SourceOptions
from wdsx.write.engines import run_jobs
from wdsx.write.jobs import JobRunner, SampleFunction, WriteError
from wdsx.write.plan import WritePlan, plan_writes
from wdsx.write.records import Records
from wdsx.write.stale import (
    earlier_shards,
    forget_earlier_manifest,
    remove_earlier_shards,
    remove_shards,
    set_aside_earlier_manifest,
)

__all__ = ["WriteReport", "execute", "function_identity", "write_dataset"]


@dataclass
class WriteReport:
    """What a run did."""

    shards: int
    """Shards in the whole plan (all ranks)."""
    written: int = 0
    """Shards this run wrote."""
    reused: int = 0
    """Shards of this rank found complete and left alone."""
    samples: int = 0
    """Samples in this rank's shards (written or reused)."""
    samples_written: int = 0
    """Samples this run wrote."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(input, reason)`` of the inputs whose function failed, in this rank's shards."""
    warnings: list[tuple[str, str]] = field(default_factory=list)
    """``(input, message)`` of the warnings raised while this run handled its inputs."""
    rank: int = 0
    """Which share of the shards this run wrote (launcher ranks; 0 for a Ray run)."""
    manifest_url: str | None = None
    """The manifest, when this run found every shard complete and wrote (or found) it."""
    removed: list[str] = field(default_factory=list)
    """Shards an earlier plan wrote at the destination, not part of this one, removed once this
    plan's manifest was in place (:mod:`wdsx.write.stale`)."""
    left: list[str] = field(default_factory=list)
    """Such shards at a remote destination, left in place for the user to remove."""
    seconds: float = 0.0


def function_identity(function: Any) -> str:
    """What names a sample function in a plan's fingerprint: ``module.qualname`` for a function,
    its ``repr`` for a configured callable (a dataclass instance, a ``functools.partial``)."""
    name = getattr(function, "__qualname__", None)
    if name is None:
        return repr(function)
    return f"{getattr(function, '__module__', '')}.{name}"


def _progress_bar(total: int, enabled: bool, unit: str) -> Any:
    """A tqdm bar on stderr (rate and ETA), or None when disabled or tqdm is not installed."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, smoothing=0.05)


def execute(
    plan: WritePlan,
    runner: JobRunner,
    *,
    engine: str = "local",
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    ray_address: str | None = None,
    progress: bool = False,
    unit: str = "input",
) -> WriteReport:
    """Write the shards of ``plan`` not yet complete, with ``runner``, on ``engine``.

    ``rank``/``world_size`` (local engine) default to this process's place in the job:
    torch.distributed's when initialised, else the launcher's (torchrun, SLURM, Open MPI or
    MPICH variables), else 0 of 1. A Ray run writes every shard from its driver. A rank whose
    shards hold no sample at all raises :class:`WriteError` (report attached) rather than
    writing the manifest of an empty dataset.
    """
    started = time.perf_counter()
    if engine == "ray":
        rank, world_size = 0, 1
    elif rank is None or world_size is None:
        rank, world_size = topology.rank_and_world()
    if not 0 <= rank < world_size:
        raise WriteError(f"rank {rank} is not in 0..{world_size - 1}")
    urls = [job.url for job in plan.jobs]
    records = Records(urls, plan.manifest_url, plan.plan_id, runner.options)
    earlier = earlier_shards(urls, plan.manifest_url, plan.plan_id, runner.options)
    set_aside_earlier_manifest(plan.manifest_url, plan.plan_id, runner.options)
    report = WriteReport(shards=len(plan.jobs), rank=rank)
    complete, jobs = [], []
    for job in plan.jobs[rank::world_size]:
        record = records.get(job.number)
        if record is None:
            jobs.append(job)
        else:
            complete.append(record)
    bar = _progress_bar(sum(len(job.inputs) for job in jobs), progress, unit)
    try:
        update = bar.update if bar is not None else (lambda n: None)
        written = run_jobs(engine, jobs, runner, workers=workers, ray_address=ray_address, progress=update)
    finally:
        if bar is not None:
            bar.close()
    report.written, report.reused = len(written), len(complete)
    report.samples_written = sum(record["shard"]["samples"] for record in written)
    for record in sorted(complete + written, key=lambda record: natural_key(record["shard"]["name"])):
        report.samples += record["shard"]["samples"]
        report.skipped += [(name, reason) for name, reason in record["skipped"]]
        report.warnings += [(name, message) for name, message in record.get("warnings", [])]
    if report.samples == 0 and (complete or written):
        remove_shards([job.url for job in plan.jobs[rank::world_size]])  # empty, every one
        examples = "; ".join(f"{name}: {reason}" for name, reason in report.skipped[:3])
        error = WriteError(
            f"no input gave a sample, nothing usable was written ({len(report.skipped)} skipped"
            f"{', e.g. ' + examples if examples else ''})"
        )
        error.report = report
        raise error
    if records.finish(plan.extra, plan.complete_extra):
        report.manifest_url = records.manifest_url
        report.removed, report.left = remove_earlier_shards(earlier)
        forget_earlier_manifest(plan.manifest_url)
    report.seconds = time.perf_counter() - started
    return report


def write_dataset(
    inputs: Sequence[Any],
    to_samples: SampleFunction,
    dest: str,
    *,
    maxcount: int = 10000,
    maxsize: float = 1e9,
    sizes: Sequence[int] | Callable[[Any], int] | None = None,
    shuffle: bool = False,
    seed: int = 0,
    engine: str = "local",
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    ray_address: str | None = None,
    strict: bool = False,
    describe: Callable[[Any], str] = str,
    extra: dict[str, Any] | None = None,
    version: str = "",
    options: SourceOptions | None = None,
    progress: bool = False,
) -> WriteReport:
    """Write the samples that ``to_samples`` makes of each of ``inputs`` into shards at ``dest``.

    ``to_samples(input)`` returns a sample (a dict of fields named by extension, encoded as
    :class:`~wdsx.TarWriter` encodes them), a list or generator of samples, or None; a sample
    without ``__key__`` is keyed by its input's number. It runs wherever the engine runs the
    shard, so it must be picklable (a module-level function or a configured callable) for
    ``workers > 1`` and Ray. Inputs are cut into shards of at most ``maxcount`` inputs, or
    ``maxsize`` bytes by ``sizes``, in input order (or shuffled by ``seed``), and described
    in reports by ``describe``.

    The output depends only on the inputs (by ``repr``), the settings, the function's name
    and ``version`` (change it when the function changes): a re-run of the same plan writes
    only the shards not yet complete, and any engine writes the same bytes. ``engine``:
    ``"local"`` (``workers`` processes; launcher ranks each write their share, see
    :func:`execute`) or ``"ray"`` (every shard a task on the cluster at ``ray_address``).
    ``extra`` goes into the manifest. ``strict`` stops at the first input whose function
    raises (:class:`WriteError`) instead of skipping it.
    """
    identity = {"function": function_identity(to_samples), "version": version, "extra": extra}
    plan = plan_writes(
        inputs,
        dest,
        maxcount=maxcount,
        maxsize=maxsize,
        sizes=sizes,
        shuffle=shuffle,
        seed=seed,
        identity=identity,
        extra=extra,
    )
    runner = JobRunner(to_samples, strict, describe, options)
    return execute(
        plan,
        runner,
        engine=engine,
        workers=workers,
        rank=rank,
        world_size=world_size,
        ray_address=ray_address,
        progress=progress,
    )
