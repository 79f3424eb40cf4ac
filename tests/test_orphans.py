"""A trainer killed at a random point of an epoch leaves nothing behind: within 10 s no process
of its tree is alive and no shared-memory segment its processes used is held by anyone or
left in /dev/shm, over a grid of loader settings and the signals a trainer dies of.

The processes are found through /proc, not through wdsx: every process of a trainer's tree
(workers, spawn's helpers) inherits a marker in its environment, and a segment is recognised
by its inode in the processes' memory maps."""

from __future__ import annotations

import io
import itertools
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import wdsx
from tests.fixtures.shards import write_tar

pytestmark = [
    pytest.mark.slow,  # 12 trainers started and killed
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads processes from /proc"),
]

REPO = Path(__file__).resolve().parents[1]
MARKER = "WDSX_TRAINER_TREE"
RUNS = 12
"""Trainers started and killed: with the signals taken in turn and the grid's seed, every
setting's value is drawn at least 4 times and each start method dies of each signal."""
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
DEADLINE = 10.0
STARTUP = 120.0
"""Seconds a trainer may take to receive the batches it is killed after (busy machines)."""

TRAINER = """
import json, signal, sys, time
import wdsx
from tests.fixtures.shards import write_tar

def main():
    # Ctrl-C raises KeyboardInterrupt, as in a trainer started from a terminal (a shell's
    # background job, such as a test run started with &, starts with it ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    urls, settings = json.loads(sys.argv[1])
    dataset = wdsx.WebDataset(urls, shardshuffle=True, manifest=False)
    if settings["shuffle"]:
        # a full buffer from the first batch: every batch carries the largest state
        dataset = dataset.shuffle(settings["shuffle"], initial=settings["shuffle"])
    loader = wdsx.WebLoader(
        dataset.decode("rgb8").batched(16),
        batch_size=None,
        num_workers=settings["workers"],
        persistent_workers=settings["persistent"],
        multiprocessing_context=settings["context"],
        decode_threads=settings["decode_threads"],
    )
    count = 0
    while True:
        for batch in loader:
            count += 1
            print(count, flush=True)
            time.sleep(0.02)  # a training step: the workers run ahead and fill their queue

if __name__ == "__main__":
    main()
"""


@dataclass(frozen=True)
class Run:
    workers: int
    shuffle: int
    persistent: bool
    context: str
    decode_threads: int
    kill_after: int
    kill_with: signal.Signals


def grid(seed: int = 25) -> list[Run]:
    """RUNS settings drawn from every combination, each killed after a random number of
    batches, with the signals taken in turn."""
    rng = random.Random(seed)
    combinations = list(itertools.product((1, 2), (0, 1000), (False, True), ("fork", "spawn"), (1, 2)))
    rng.shuffle(combinations)
    return [
        Run(*settings, kill_after=rng.randint(1, 30), kill_with=SIGNALS[number % len(SIGNALS)])
        for number, settings in enumerate(combinations[:RUNS])
    ]


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory) -> list[str]:
    """Four shards of 600 samples with a 40x40 JPEG each: 16 of them are a batch large enough
    to travel in the transport's shared memory."""
    directory = tmp_path_factory.mktemp("orphans")
    rng = np.random.default_rng(0)
    urls = []
    for shard in range(4):
        samples = []
        for index in range(600):
            image = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image, "JPEG")
            samples.append((f"s{shard}-{index:05d}.jpg", image.getvalue()))
        urls.append(write_tar(str(directory / f"shard-{shard:06d}.tar"), samples))
    return urls


def members(token: str) -> set[int]:
    """The live processes whose environment carries ``token`` (a zombie has no environment)."""
    wanted = f"{MARKER}={token}".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environment = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's
            continue
        if wanted in environment.split(b"\0"):
            found.add(int(entry))
    return found


def shared_segments(pids: set[int] | None) -> set[tuple[str, str, str]]:
    """(device, inode, name) of the shared-memory files mapped by ``pids`` (None: by every
    process): files in /dev/shm, named or unlinked, and memfd files."""
    segments = set()
    for pid in pids if pids is not None else [int(e) for e in os.listdir("/proc") if e.isdigit()]:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(("/dev/shm/", "/memfd:")):
                segments.add((fields[3], fields[4], fields[5]))
    return segments


def start(run: Run, urls: list[str], directory: Path) -> tuple[subprocess.Popen, str]:
    """The trainer of ``run``, in a session of its own, and the marker of its processes."""
    settings = {
        "workers": run.workers,
        "shuffle": run.shuffle,
        "persistent": run.persistent,
        "context": run.context,
        "decode_threads": run.decode_threads,
    }
    return launch(TRAINER, [urls, settings], directory)


def launch(program: str, argument: object, directory: Path) -> tuple[subprocess.Popen, str]:
    """``program`` run with ``argument`` (as JSON) in a session of its own, and the marker
    its processes carry."""
    token = uuid.uuid4().hex
    script = directory / "trainer.py"
    script.write_text(program)
    environment = {**os.environ, MARKER: token, "PYTHONPATH": str(REPO)}
    with (directory / "stderr.txt").open("wb") as errors:
        process = subprocess.Popen(
            [sys.executable, str(script), json.dumps(argument)],
            stdout=subprocess.PIPE,
            stderr=errors,
            env=environment,
            start_new_session=True,
        )
    return process, token


def assert_gone_in_time(token: str, what: str) -> None:
    """Within :data:`DEADLINE` seconds no process carrying ``token`` is alive."""
    deadline = time.monotonic() + DEADLINE
    alive = members(token)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = members(token)
    assert not alive, f"{what}: processes {sorted(alive)} still alive {DEADLINE} s after the signal"


def end_all(process: subprocess.Popen, token: str) -> None:
    """Kill what a failed run left (it ends with the test), and reap the trainer."""
    for pid in members(token) | {process.pid}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


def wait_for_batches(process: subprocess.Popen, count: int, directory: Path) -> None:
    """Wait until the trainer has received ``count`` batches (it prints a line for each)."""
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP
    seen = b""
    while seen.count(b"\n") < count:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(0.0, remaining))
        chunk = os.read(process.stdout.fileno(), 4096) if ready else b""
        if not chunk:
            if process.poll() is None:
                process.kill()
            process.wait()
            errors = (directory / "stderr.txt").read_text()
            received = seen.count(b"\n")
            raise AssertionError(f"the trainer received {received} of {count} batches:\n{errors}")
        seen += chunk


def trial(run: Run, urls: list[str], directory: Path) -> None:
    """Start the trainer of ``run``, kill it after ``run.kill_after`` batches, and check
    that nothing of it is left once it is gone."""
    directory.mkdir()
    process, token = start(run, urls, directory)
    try:
        wait_for_batches(process, run.kill_after, directory)
        tree = members(token)
        segments = shared_segments(tree)
        if run.kill_with == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole group
        else:
            process.send_signal(run.kill_with)
        assert_gone_in_time(token, str(run))
    finally:
        end_all(process, token)
    assert any("/memfd:wdsx-batch" in name for _, _, name in segments), f"{run}: no batch segment seen"
    held = shared_segments(None) & segments
    assert not held, f"{run}: segments of the dead trainer still mapped: {held}"
    named = [name for _, _, name in segments if not name.endswith("(deleted)") and os.path.exists(name)]
    assert not named, f"{run}: segments left in /dev/shm: {named}"
    pids = "|".join(str(pid) for pid in tree)
    left = [
        name
        for name in os.listdir("/dev/shm")
        if re.search(rf"(?<![0-9A-Za-z])({pids})(?![0-9A-Za-z])", name)
    ]
    assert not left, f"{run}: /dev/shm entries named after the trainer's processes: {left}"


def test_a_killed_trainer_leaves_no_worker_and_no_shared_memory(image_shards, tmp_path):
    runs = grid()
    with ThreadPoolExecutor(2) as pool:
        outcomes = [
            pool.submit(trial, run, image_shards, tmp_path / f"run-{number:02d}")
            for number, run in enumerate(runs)
        ]
        for outcome in outcomes:
            outcome.result()


def test_workers_started_from_a_thread_that_ends_live_on(shards):
    """The kernel's parent-death signal follows the thread that started a worker: a loader
    first iterated in a thread that then ends must keep its workers."""
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=False, manifest=False).to_tuple("__key__").batched(5)
    batches = iter(wdsx.WebLoader(dataset, batch_size=None, num_workers=2))
    first: list = []
    starter = threading.Thread(target=lambda: first.append(next(batches)))
    starter.start()
    starter.join()
    keys = [key for batch in [*first, *batches] for key in batch[0]]
    assert sorted(keys) == sorted(shards.keys)


PIPE_TRAINER = """
import json, sys, time
import wdsx

urls, counts, workers = json.loads(sys.argv[1])
dataset = wdsx.WebDataset(urls, shardshuffle=False, counts=counts).to_tuple("__key__").batched(4)
loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
for count, batch in enumerate(loader, 1):
    print(count, flush=True)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("kill_with", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_trainer_leaves_no_pipe_command(tmp_path, workers, kill_with):
    """The second shard's command, opened ahead while the first is read, writes nothing for a
    minute (a server that is slow to answer): when the trainer is killed, the command, all it
    started, and whatever watched it are gone within the deadline all the same."""
    shard = write_tar(str(tmp_path / "shard.tar"), [(f"k{i:03d}.txt", b"x") for i in range(40)])
    urls = [f"pipe:cat {shard}", f"pipe:sleep 60; cat {shard}"]
    process, token = launch(PIPE_TRAINER, [urls, [40, 40], workers], tmp_path)
    try:
        wait_for_batches(process, 3, tmp_path)
        assert any(b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in members(token))
        process.send_signal(kill_with)
        assert_gone_in_time(token, f"{workers} workers, {kill_with!r}")
    finally:
        end_all(process, token)
