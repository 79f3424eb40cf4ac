"""Checkpoints are checked completely when loaded: a tampered one is refused there with a
StateError, or resumes exactly.

Real checkpoints of small pipelines (a shuffled, batched WebDataset; a WebLoader; a Mix) are
tampered with by a seeded mutator, then loaded into a fresh pipeline. The oracle is the
uninterrupted run: a state accepted by ``load_state_dict`` must give exactly the batches
that run gave after the checkpoint; anything else must be a StateError raised by
``load_state_dict`` itself (never at iteration time, never another exception type).
"""

from __future__ import annotations

import base64
import copy
import json
import random
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import wdsx
from tests.fixtures.peak import REPORT_PEAK, reported_peak
from tests.fixtures.shards import make_shards
from wdsx.errors import StateError

DIGEST = "digest"


# --- pipelines and their real checkpoints ------------------------------------------------
def webdataset(urls: list[str], seed: int | None = None) -> wdsx.DataPipeline:
    return (
        wdsx.WebDataset(urls, shardshuffle=True, manifest=False, seed=seed)
        .shuffle(6)
        .to_tuple("__key__", "cls")
        .batched(3)
    )


def loader(urls: list[str], workers: int, seed: int | None = None) -> wdsx.DataPipeline:
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


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("validation")
    first = make_shards(str(root / "a"), [7, 5, 9, 6]).urls
    second = make_shards(str(root / "b"), [4, 6, 5]).urls
    return {
        "webdataset": Case("webdataset", lambda: webdataset(first), [2, 6], first),
        "loader": Case("loader", lambda: loader(first, 0), [3, 5], first),
        "mix": Case("mix", lambda: mixture(first, second), [2, 7], first + second),
        "other": Case("other", lambda: webdataset(second), [3], second),
    }


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> Case:
    urls = make_shards(str(tmp_path_factory.mktemp("workers")), [7, 5, 9, 6]).urls
    return Case("loader-2", lambda: loader(urls, 2), [4], urls)


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


def test_the_zlib_bomb_is_what_it_claims():
    assert zlib.decompress(zlib_bomb(3)) == bytes(3 << 20)


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


def mutate(
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
        tampered, what = mutate(original, others, strangers, rng, in_range=keep_digest)
        tally[check(case, tampered, rest, what)] += 1
    return tally


# --- the fuzz ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_thousand_tampered_checkpoints_are_refused_at_load_or_resume_exactly(cases):
    """States as ``state_dict()`` writes them (with their digest), tampered in every way."""
    tally = tamper_many(list(cases.values()), cases["other"], 1000, seed=25, keep_digest=True)
    assert tally["refused"] > 900


@pytest.mark.slow
def test_tampered_checkpoints_without_a_digest_are_refused_by_their_field_checks(cases):
    """States without a digest (as older wdsx wrote them): every value out of its range or
    of the wrong type, every corrupt or oversized position string, another pipeline's state."""
    tally = tamper_many(list(cases.values()), cases["other"], 1000, seed=4, keep_digest=False)
    assert tally["refused"] > 900


@pytest.mark.slow
def test_tampered_checkpoints_of_a_two_worker_loader_are_refused_in_the_main_process(cases, two_workers):
    tally = tamper_many([two_workers], cases["other"], 30, seed=7, keep_digest=False)
    tally_signed = tamper_many([two_workers], cases["other"], 20, seed=8, keep_digest=True)
    assert tally["refused"] + tally_signed["refused"] > 40


def test_the_untampered_checkpoints_resume_exactly(cases):
    for case in cases.values():
        for state, rest in case.checkpoints:
            assert case.resumed(copy.deepcopy(state)) == rest
            assert case.resumed(without_digest(state)) == rest


# --- one test per reported probe -------------------------------------------------------------
def first_state(cases: dict[str, Case], name: str = "webdataset") -> dict:
    """A copy of the first checkpoint of ``name``, without its digest (so that a field edit
    is caught by the field's own check, as in a state written before digests)."""
    return without_digest(copy.deepcopy(cases[name].checkpoints[0][0]))


def refused(case: Case, state: Any) -> str:
    """The message of the StateError ``load_state_dict`` raises for ``state``."""
    with pytest.raises(StateError) as error:
        case.build().load_state_dict(state)
    return str(error.value)


@pytest.mark.parametrize(
    ("field", "value", "found"),
    [
        ("offset", -5, "found -5 (int)"),  # was OSError: Invalid argument, in a worker
        ("offset", 2**70, "found 1180591620717411303424 (int)"),  # was OverflowError
        ("ordinal", "3", "found '3' (str)"),  # was TypeError
        ("pos", 40, "found 40 (int)"),  # a shard outside the reader's share: other samples
        ("span", 7, "found 7 (int)"),
    ],
)
def test_a_bad_reader_cursor_is_refused_at_load_naming_the_field(cases, field, value, found):
    state = first_state(cases)
    state["stages"]["reader"][field] = value
    message = refused(cases["webdataset"], state)
    assert message.startswith(f"checkpoint field $.stages.reader.{field}: expected ")
    assert message.endswith(found)


def test_a_missing_fingerprint_is_refused_naming_it(cases):
    state = first_state(cases)
    del state["fingerprint"]  # was KeyError: 'fingerprint', in a worker
    assert refused(cases["webdataset"], state) == (
        "checkpoint field $.fingerprint: expected a value, found nothing (the field is missing)"
    )


@pytest.mark.parametrize(("field", "value"), [("passes", -3), ("epoch", -1), ("topology", [3, 2])])
def test_impossible_envelope_counts_are_refused(cases, field, value):
    state = first_state(cases)
    state[field] = value
    assert refused(cases["webdataset"], state).startswith(f"checkpoint field $.{field}: expected ")


def test_a_negative_draw_count_is_refused(cases):
    state = first_state(cases)
    state["stages"]["shuffle"]["draws"] = -4
    assert refused(cases["webdataset"], state) == (
        "checkpoint field $.stages.shuffle.draws: expected an integer >= 0 and below 2**53, found -4 (int)"
    )


def test_a_sample_held_twice_is_refused(cases):
    state = first_state(cases)
    state["stages"]["shuffle"]["positions"] = duplicated_positions(state["stages"]["shuffle"]["positions"])
    assert "held twice" in refused(cases["webdataset"], state)


def test_positions_outside_the_url_table_are_refused(cases):
    from wdsx.state.position import pack_positions

    state = first_state(cases)
    state["stages"]["shuffle"]["positions"] = pack_positions([(len(state["urls"]), 0, 0, 0)])
    assert "missing from its URL table" in refused(cases["webdataset"], state)


@pytest.mark.parametrize("checkpoint", [[], [{"format": "wdsx-state"}], None, "wdsx-state"])
def test_a_checkpoint_that_is_not_an_object_is_refused(cases, checkpoint):
    assert "not a wdsx-state checkpoint" in refused(cases["loader"], checkpoint)


def test_the_digest_refuses_an_edit_no_field_check_can_see(cases):
    state = copy.deepcopy(cases["webdataset"].checkpoints[0][0])
    state["stages"]["reader"]["ordinal"] += 1  # within range: another sample, silently
    assert refused(cases["webdataset"], state).startswith("checkpoint field $.digest: expected sha256:")


def test_another_datasets_state_with_strict_false_warns_and_reads_only_this_dataset(cases):
    """The README's promise: a state of another shard list warns instead of raising. What
    still applies is kept (the epoch, the seed); the other dataset's positions are not read:
    the resumed run is this dataset's epoch from its start."""
    state, _ = cases["other"].checkpoints[0]
    pipeline = cases["webdataset"].build()
    with pytest.warns(UserWarning, match="strict=False: resuming epoch 0"):
        pipeline.load_state_dict(copy.deepcopy(state), strict=False)
    assert keys_of(pipeline) == keys_of(cases["webdataset"].build())


def zlib_bomb_script(directory: str) -> str:
    """A program that loads a checkpoint whose buffer positions inflate to 800 MB and prints
    the error and its time (the caller adds the report of its peak memory)."""
    return f"""
import base64, json, time
import wdsx
from tests.fixtures.shards import make_shards
from tests.test_checkpoint_validation import zlib_bomb

urls = make_shards({directory!r}, [7, 5]).urls
def build():
    return wdsx.WebDataset(urls, shardshuffle=True, manifest=False).shuffle(6).batched(3)
pipeline = build()
batches = iter(pipeline)
next(batches)
state = pipeline.state_dict()
state.pop("digest")
state["stages"]["shuffle"]["positions"] = "1:11111:" + base64.b64encode(zlib_bomb(800)).decode()
began = time.perf_counter()
try:
    build().load_state_dict(state)
except wdsx.StateError as error:
    print(json.dumps({{"error": str(error), "seconds": time.perf_counter() - began}}))
"""


def test_a_zlib_bomb_in_packed_positions_is_refused_quickly_in_bounded_memory(tmp_path):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(
        [sys.executable, "-c", REPORT_PEAK + zlib_bomb_script(str(tmp_path / "shards"))],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=120,
        check=True,
    )
    report = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    assert report["error"].startswith(
        "checkpoint field $.stages.shuffle.positions: expected packed positions"
    )
    assert report["seconds"] < 10
    peak = reported_peak(result.stdout)
    assert peak is not None and peak < 500 << 20


def test_a_seed_mismatch_is_found_at_load_not_in_a_worker(two_workers):
    state, _ = two_workers.checkpoints[0]
    with pytest.raises(StateError, match="seed differs: checkpoint has 0, pipeline has 9"):
        loader(two_workers.urls, 2, seed=9).load_state_dict(copy.deepcopy(state))


def test_strict_false_resumes_a_loader_with_the_checkpoints_seed_without_raising_in_workers(two_workers):
    """The README's promise for another seed: a warning instead of an error; the checkpoint's
    seed is adopted, so the resumed batches are those of the uninterrupted run."""
    state, rest = two_workers.checkpoints[0]
    resumed = loader(two_workers.urls, 2, seed=9)
    with pytest.warns(UserWarning, match="strict=False: resuming epoch 0 with the checkpoint's seed 0"):
        resumed.load_state_dict(copy.deepcopy(state), strict=False)
    assert keys_of(resumed) == rest


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("loader", ("stages", "loader", "states", 0, "stages", "shuffle", "draws")),
        ("mix", ("stages", "mix", "sources", 0, "stages", "shuffle", "draws")),
    ],
)
def test_a_nested_state_is_checked_by_its_own_pipeline_and_named_by_its_full_path(cases, name, path):
    """A worker's state inside a loader's, a source's inside a mixture's: checked at load."""
    state = first_state(cases, name)
    put(state, path, -1)
    where = "$." + ".".join(str(key) for key in path).replace(".0.", "[0].")
    assert refused(cases[name], state).startswith(f"checkpoint field {where}: expected an integer >= 0")
