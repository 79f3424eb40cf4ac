"""The plan of a shard-writing run: every shard and the inputs that go into it, decided before
anything is written.

Because the plan depends only on the inputs and the settings, every process that computes it
(a worker, a launcher rank, the driver of a Ray cluster) gets the same one, each shard is an
independent job, and a re-run can tell which shards are already done: a shard's completion
record carries the plan's fingerprint (:attr:`WritePlan.plan_id`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from wdsx.core import rng
from wdsx.read.manifest import ShardEntry, manifest_url_for_pattern
from wdsx.write.writer import checked_pattern, shard_is_full

__all__ = ["ShardJob", "WritePlan", "cut_into_shards", "plan_fingerprint", "plan_writes", "shard_pattern"]

PLAN_VERSION = 1
"""Bump when the bytes written for the same plan change, so that old shards are not reused."""


@dataclass(frozen=True)
class ShardJob:
    """One shard to write: where, and which inputs (with their numbers in the input list)."""

    number: int
    """The shard's index in the plan."""
    url: str
    inputs: tuple[tuple[int, Any], ...]
    """``(input number, input)`` pairs, in the order their samples are written."""
    plan_id: str


@dataclass
class WritePlan:
    """Every shard of a run (all ranks), the manifest they end up in, and what the manifest
    says besides the shards."""

    jobs: list[ShardJob]
    manifest_url: str
    plan_id: str
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields written into the manifest beside its shard list (say, ``classes``)."""
    complete_extra: Callable[[list[ShardEntry], dict[str, Any]], dict[str, Any]] | None = None
    """Called with every shard's entry and :attr:`extra` when the manifest is about to be
    written: the extra fields that depend on what the shards hold (a field set's field names)."""


def shard_pattern(dest: str) -> str:
    """DEST as a shard pattern: kept if it has a ``%`` directive; ``out/train`` ->
    ``out/train-%06d.tar``, ``out/`` -> ``out/%06d.tar``."""
    if "%" in dest:
        return dest
    return dest + ("%06d.tar" if dest.endswith("/") else "-%06d.tar")


def cut_into_shards(
    count: int, sizes: Sequence[int] | None, maxcount: int, maxsize: float, order: Sequence[int] | None = None
) -> list[list[int]]:
    """The input numbers of each shard, cutting ``order`` (default ``0..count-1``) by
    ``ShardWriter``'s rule: a shard takes no more at ``maxcount`` inputs or ``maxsize`` bytes
    (the inputs' ``sizes``; without sizes, only the count applies)."""
    if maxcount < 1 or maxsize <= 0:
        raise ValueError("maxcount and maxsize must be positive")
    shards: list[list[int]] = []
    size = 0
    for number in range(count) if order is None else order:
        if not shards or shard_is_full(len(shards[-1]), size, maxcount, maxsize):
            shards.append([])
            size = 0
        shards[-1].append(number)
        size += sizes[number] if sizes is not None else 0
    return shards


def plan_fingerprint(identity: Any, shards: Sequence[Sequence[tuple[int, Any]]]) -> str:
    """A hash of everything the output bytes depend on: ``identity`` (settings, the function's
    name and version, as JSON) and every shard's inputs (by ``repr``)."""
    digest = hashlib.sha256(json.dumps([PLAN_VERSION, identity], sort_keys=True, default=repr).encode())
    for number, shard in enumerate(shards):
        for input_number, item in shard:
            digest.update(f"{number}\t{input_number}\t{item!r}\n".encode())
    return digest.hexdigest()


def plan_writes(
    inputs: Sequence[Any],
    dest: str,
    *,
    maxcount: int = 10000,
    maxsize: float = 1e9,
    sizes: Sequence[int] | Callable[[Any], int] | None = None,
    shuffle: bool = False,
    seed: int = 0,
    identity: Any = None,
    extra: dict[str, Any] | None = None,
) -> WritePlan:
    """Cut ``inputs`` into the shards at ``dest`` (a pattern such as ``out/train-%06d.tar``, or
    a prefix, see :func:`shard_pattern`).

    ``sizes`` (one per input, or a function of an input) lets ``maxsize`` cut by bytes; the
    inputs are written in their order, or in a permutation drawn from ``seed`` with
    ``shuffle``. ``identity`` is whatever else decides the output bytes (the sample function
    and its settings): it goes into the plan's fingerprint.
    """
    pattern = checked_pattern(shard_pattern(dest))
    if callable(sizes):
        sizes = [sizes(item) for item in inputs]
    if sizes is not None and len(sizes) != len(inputs):
        raise ValueError(f"{len(sizes)} sizes for {len(inputs)} inputs")
    order = rng.permutation(len(inputs), rng.derive_seed("wdsx convert", seed)) if shuffle else None
    numbers = cut_into_shards(len(inputs), sizes, maxcount, maxsize, order)
    shards = [tuple((number, inputs[number]) for number in shard) for shard in numbers]
    settings = {"maxcount": maxcount, "maxsize": maxsize, "shuffle": shuffle, "seed": seed}
    plan_id = plan_fingerprint([settings, identity], shards)
    jobs = [ShardJob(number, pattern % number, shard, plan_id) for number, shard in enumerate(shards)]
    return WritePlan(jobs, manifest_url_for_pattern(pattern), plan_id, dict(extra or {}))
