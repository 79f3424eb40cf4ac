"""Real checkpoints of small pipelines, and a seeded mutator that tampers with them: the
inputs of the checkpoint tests (``tests/test_checkpoint_validation.py``) and of the fuzz
campaign's ``states`` surface.

The pipelines (a shuffled, batched WebDataset; a WebLoader; a Mix) are checkpointed after some
batches; a :class:`Case` keeps each checkpoint with what the uninterrupted run yields after it,
the oracle a resumed pipeline must match.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import random
import zlib
from collections.abc import Callable
from typing import Any

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.errors import StateError

DIGEST = "digest"


# --- pipelines and their real checkpoints ------------------------------------------------
def webdataset(urls: list[str], seed: int = 0) -> wdsx.DataPipeline:
    return (
        wdsx.WebDataset(urls, shardshuffle=True, manifest=False, seed=seed)
        .shuffle(6)
        .to_tuple("__key__", "cls")
        .batched(3)
    )


def loader(urls: list[str], workers: int, seed: int = 0) -> wdsx.DataPipeline:
    batches = wdsx.WebLoader(webdataset(urls, seed), batch_size=None, num_workers=workers)
    return batches.unbatched().shuffle(4).batched(4)


def mixture(first: list[str], second: list[str]) -> wdsx.DataPipeline:
    sources = [
        wdsx.WebDataset(urls, shardshuffle=True, manifest=False).shuffle(4).to_tuple("__key__", "cls")
        for urls in (first, second)
    ]
    return wdsx.Mix(sources, [1, 2], seed=3).batched(3)


def keys_of(batches: Any) -> list[list[str]]:
    return [list(batch[0]) for batch in batches]


class Case:
    """A pipeline, checkpoints of it taken after some batches, and what an uninterrupted run
    yields after each."""

    def __init__(self, name: str, build: Callable[[], wdsx.DataPipeline], stops: list[int], urls: list[str]):
        self.name = name
        self.build = build
        self.urls = urls
        full = keys_of(build())
        self.checkpoints: list[tuple[dict, list[list[str]]]] = []
        for stop in stops:
            pipeline = build()
            batches = iter(pipeline)
            for _ in range(stop):
                next(batches)
            state = json.loads(json.dumps(pipeline.state_dict()))
            self.checkpoints.append((state, full[stop:]))
            pipeline.close()

    def outcome(self, state: Any) -> str:
        """ "refused" (a StateError from load_state_dict) or "exact"; anything else fails."""
        pipeline = self.build()
        try:
            pipeline.load_state_dict(state)
        except StateError:
            return "refused"
        return "loaded"

    def resumed(self, state: Any) -> list[list[str]]:
        pipeline = self.build()
        pipeline.load_state_dict(state)
        try:
            return keys_of(pipeline)
        finally:
            pipeline.close()


def standard_cases(root: str) -> dict[str, Case]:
    """Checkpoints of a WebDataset, a loader and a mixture over shards written under ``root``,
    and of another WebDataset ("other", whose states are foreign to the rest)."""
    first = make_shards(os.path.join(root, "a"), [7, 5, 9, 6]).urls
    second = make_shards(os.path.join(root, "b"), [4, 6, 5]).urls
    return {
        "webdataset": Case("webdataset", lambda: webdataset(first), [2, 6], first),
        "loader": Case("loader", lambda: loader(first, 0), [3, 5], first),
        "mix": Case("mix", lambda: mixture(first, second), [2, 7], first + second),
        "other": Case("other", lambda: webdataset(second), [3], second),
    }


# --- the mutator ---------------------------------------------------------------------------
Path = tuple[Any, ...]


def nodes(tree: Any, path: Path = ()) -> list[Path]:
    """Every path in a JSON tree (the root included)."""
    found = [path]
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += nodes(value, path + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found += nodes(value, path + (index,))
    return found


def get(tree: Any, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def put(tree: Any, path: Path, value: Any) -> Any:
    """``tree`` with the node at ``path`` replaced (the root itself when ``path`` is empty)."""
    if not path:
        return value
    get(tree, path[:-1])[path[-1]] = value
    return tree


def is_packed(value: Any) -> bool:
    return isinstance(value, str) and value.count(":") == 2 and value.split(":")[0].isdigit()


def zlib_bomb(megabytes: int) -> bytes:
    """A valid zlib stream of ``megabytes`` MiB of zeros, about 1 KB per MiB, made without
    ever holding the inflated data: a compressed MiB, flushed so that it stands alone, is
    repeated, then closed by an empty final block and the checksum of the whole."""
    zeros = bytes(1 << 20)
    packer = zlib.compressobj(9)
    head = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
    checksum = 1
    for _ in range(megabytes):
        checksum = zlib.adler32(zeros, checksum)
    return head + block * (megabytes - 1) + b"\x03\x00" + checksum.to_bytes(4, "big")


_BOMB: list[str] = []


def a_bomb(rng: random.Random) -> str:
    """Packed positions that inflate to 800 MB, claiming a few rows or very many."""
    if not _BOMB:
        _BOMB.append(base64.b64encode(zlib_bomb(800)).decode())
    declared = rng.choice([1, 3, 160_000_000, 2**40])
    return f"{declared}:11111:{_BOMB[0]}"


def corrupt_packed(value: str, rng: random.Random) -> str:
    count, widths, data = value.split(":")
    choice = rng.randrange(7)
    if choice == 0:
        return f"{int(count) + rng.choice([-1, 1, 1000])}:{widths}:{data}"
    if choice == 1:
        return f"{count}:{widths[::-1] if len(set(widths)) > 1 else '88888'}:{data}"
    if choice == 2:
        return f"{count}:{widths}:{data[: len(data) // 2]}"
    if choice == 3:
        at = rng.randrange(len(data))
        return f"{count}:{widths}:{data[:at]}{'A' if data[at] != 'A' else 'B'}{data[at + 1 :]}"
    if choice == 4:
        return f"{count}:{widths}"
    if choice == 5:
        return f"{count}:{widths}:{data}!!"
    return f"-{count}:{widths}:{data}"


def duplicated_positions(value: str) -> str | None:
    """The same packed positions with one of them held twice (None when there are none)."""
    from wdsx.state.position import pack_positions, unpack_positions

    rows = unpack_positions(value)
    return pack_positions(rows + rows[:1]) if rows else None


def change_number(value: int, rng: random.Random, in_range: bool) -> Any:
    """Negative and huge numbers always; off-by-one and zero only when ``in_range``
    edits are allowed."""
    wild = [-1, -value - 1, -3, 2**63, 10**30, -(2**70)]
    near = [value + 1, value - 1, 0, value + 2]
    return rng.choice(wild + near if in_range else wild)


def change_type(value: Any, rng: random.Random) -> Any:
    options = [str(value), None, [value], {"value": value}, 1.5]
    if isinstance(value, int) and not isinstance(value, bool):
        options += [float(value) + 0.5, bool(value % 2)]
    if isinstance(value, bool):
        options += [int(value), "true"]
    return rng.choice(options)


def tampered(
    state: dict, others: list[dict], foreign: list[dict], rng: random.Random, in_range: bool
) -> tuple[Any, str]:
    """A tampered copy of ``state`` and what was done; ``others`` are the other checkpoints,
    ``foreign`` those of other pipelines. ``in_range=False`` limits the edits to those that
    leave a value no checkpoint of this pipeline could hold (so they must be refused even
    without a digest); ``True`` adds edits within range (off by one, deleted keys, list items
    removed, duplicated or reordered, stage states swapped in from other checkpoints), which
    only the digest can tell apart."""
    tree = copy.deepcopy(state)
    paths = [p for p in nodes(tree) if not p or p[-1] != DIGEST]
    path = rng.choice(paths)
    value = get(tree, path)
    roll = rng.random()
    if roll < 0.04:
        return rng.choice([[], [tree], None, "wdsx-state", 3, {"format": "wdsx-state"}]), "not an object"
    if roll < 0.10:
        other = copy.deepcopy(rng.choice(foreign))
        if not in_range:
            other.pop(DIGEST, None)
        return other, "another pipeline's state"
    if roll < 0.16 and in_range:
        donor = rng.choice(others)
        donor_paths = [p for p in nodes(donor) if p and p[0] == "stages" and len(p) == 2]
        target = [p for p in nodes(tree) if p and p[0] == "stages" and len(p) == 2]
        if donor_paths and target:
            where = rng.choice(target)
            return put(tree, where, copy.deepcopy(get(donor, rng.choice(donor_paths)))), f"swap {where}"
    if is_packed(value):
        kind = rng.random()
        if kind < 0.3:
            return put(tree, path, a_bomb(rng)), f"zlib bomb at {path}"
        if kind < 0.5:
            twice = duplicated_positions(value)
            if twice is not None:
                return put(tree, path, twice), f"duplicate position at {path}"
        return put(tree, path, corrupt_packed(value, rng)), f"corrupt packed at {path}"
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return put(tree, path, change_type(value, rng)), f"type at {path}"
    if isinstance(value, int):
        if rng.random() < 0.7:
            return put(tree, path, change_number(value, rng, in_range)), f"number at {path}"
        return put(tree, path, change_type(value, rng)), f"type at {path}"
    if isinstance(value, dict) and value:
        key = rng.choice(list(value))
        if in_range and rng.random() < 0.5:
            del value[key]
            return tree, f"delete {path + (key,)}"
        return put(tree, path, list(value.values())), f"object to list at {path}"
    if isinstance(value, list) and value:
        if in_range:
            index = rng.randrange(len(value))
            action = rng.choice(["delete", "duplicate", "swap", "empty"])
            if action == "delete":
                del value[index]
            elif action == "duplicate":
                value.insert(index, copy.deepcopy(value[index]))
            elif action == "swap":
                value.reverse()
            else:
                value.clear()
            return tree, f"list {action} at {path}"
        return put(tree, path, {"0": value[0]}), f"list to object at {path}"
    return put(tree, path, change_type(value, rng)), f"type at {path}"


def check(case: Case, state: Any, expected: list[list[str]], what: str) -> str:
    """Load a tampered state: refused with a StateError, or resumed exactly."""
    if case.outcome(state) == "refused":
        return "refused"
    assert case.resumed(state) == expected, f"{case.name}: {what} was accepted and yields other samples"
    return "exact"


def without_digest(state: Any) -> Any:
    if isinstance(state, dict):
        state = dict(state)
        state.pop(DIGEST, None)
    return state


def tamper_many(cases: list[Case], foreign: Case, count: int, seed: int, keep_digest: bool) -> dict[str, int]:
    """Tamper ``count`` times with checkpoints of ``cases`` (states of ``foreign``, another
    pipeline, are swapped in too), and check each outcome."""
    rng = random.Random(seed)
    checkpoints = [(case, state, rest) for case in cases + [foreign] for state, rest in case.checkpoints]
    tally = {"refused": 0, "exact": 0}
    for _ in range(count):
        case, state, rest = rng.choice([checkpoint for checkpoint in checkpoints if checkpoint[0] in cases])
        others = [other for _, other, _ in checkpoints if other is not state]
        strangers = [other for owner, other, _ in checkpoints if owner.name != case.name]
        original = state if keep_digest else without_digest(state)
        changed, what = tampered(original, others, strangers, rng, in_range=keep_digest)
        tally[check(case, changed, rest, what)] += 1
    return tally
