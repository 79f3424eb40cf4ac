"""Real torchrun jobs on loopback (gloo): two "nodes" x two processes x two DataLoader workers.

Checked from the keys every rank logs: the union of samples trained on is the dataset, none
twice (samples marked as padding aside), every rank runs the same number of batches (else DDP
would hang), and a job killed mid-epoch resumes on another number of ranks and workers with
every remaining sample read exactly once."""

from __future__ import annotations

import glob
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import PIL.Image
import pytest
import torch

from tests.fixtures.shards import write_tar

pytestmark = pytest.mark.slow  # real torchrun jobs

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "examples", "train_ddp.py")
TIMEOUT = 240


def png(value: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.full((28, 28), value % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def make_dataset(directory: str, counts: list[int], prefix: str = "n") -> tuple[str, list[str]]:
    os.makedirs(directory, exist_ok=True)
    keys = []
    for shard, count in enumerate(counts):
        members = []
        for i in range(count):
            key = f"{prefix}{shard}_{i:03d}"
            keys.append(key)
            members += [(f"{key}.png", png(i)), (f"{key}.cls", str(i % 10).encode())]
        write_tar(os.path.join(directory, f"train-{shard:06d}.tar"), members)
    return os.path.join(directory, f"train-{{000000..{len(counts) - 1:06d}}}.tar"), keys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(nnodes: int, nproc: int, args: list[str]) -> list[subprocess.Popen]:
    """Start one torchrun per node, all on this machine."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=os.getcwd())
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--nproc_per_node={nproc}",
                f"--node_rank={node}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                SCRIPT,
                *args,
            ],  # fmt: skip
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nnodes)
    ]


def finish(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        try:
            output, _ = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            kill(processes)
            raise
        assert process.returncode == 0, output[-3000:]


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchrun starts each rank in its own session)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stream:
                    parent = int(stream.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill(processes: list[subprocess.Popen]) -> None:
    """Crash the whole job at once, as a lost node would: launchers, ranks and workers."""
    victims = [p.pid for p in processes] + [pid for p in processes for pid in descendants(p.pid)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for process in processes:
        process.wait(timeout=30)


def read_logs(directory: str) -> dict[int, list[dict]]:
    logs = {}
    for path in glob.glob(os.path.join(directory, "rank*.log")):
        rank = int(os.path.basename(path)[4:-4])
        with open(path) as stream:
            logs[rank] = [json.loads(line) for line in stream]
    return logs


def trained(logs: dict[int, list[dict]], up_to_step: int | None = None) -> tuple[Counter, int]:
    """(count of each non-padding key, number of padding samples) over steps <= up_to_step."""
    keys, pads = Counter(), 0
    for records in logs.values():
        for record in records:
            if "keys" not in record or (up_to_step is not None and record["step"] > up_to_step):
                continue
            for key, pad in zip(record["keys"], record["pads"]):
                if pad:
                    pads += 1
                else:
                    keys[key] += 1
    return keys, pads


def batches_per_rank(logs: dict[int, list[dict]]) -> set[int]:
    return {record["batches"] for records in logs.values() for record in records if "epoch_end" in record}


def lengths_per_rank(logs: dict[int, list[dict]]) -> set[int]:
    """What ``len(loader)`` said on each rank at the start of each epoch."""
    return {record["len"] for records in logs.values() for record in records if "epoch_start" in record}


@pytest.mark.parametrize(
    "counts",
    [[24] * 8, [30, 26, 5, 40, 31, 19, 25], [20, 21, 19]],
    ids=["divisible", "uneven", "fewer-shards-than-readers"],
)
def test_two_nodes_read_every_sample_once_with_equal_batches(tmp_path, counts):
    pattern, keys = make_dataset(str(tmp_path / "data"), counts)
    logs_dir = str(tmp_path / "keys")
    args = ["--shards", pattern, "--workdir", str(tmp_path / "run"), "--workers", "2", "--keys-dir", logs_dir]
    finish(launch(2, 2, args))
    logs = read_logs(logs_dir)
    assert sorted(logs) == [0, 1, 2, 3]
    seen, pads = trained(logs)
    assert seen == Counter(keys) and pads == 0
    assert len(batches_per_rank(logs)) == 1
    assert lengths_per_rank(logs) == batches_per_rank(logs)


def one_dataset(tmp_path) -> tuple[list[str], list[str]]:
    pattern, keys = make_dataset(str(tmp_path / "data"), [24] * 8)
    return ["--shards", pattern], keys


def three_mixed_datasets(tmp_path) -> tuple[list[str], list[str]]:
    args, keys = [], []
    for name, counts in [("a", [24] * 4), ("b", [17, 30, 9]), ("c", [20, 20])]:
        pattern, source_keys = make_dataset(str(tmp_path / name), counts, prefix=name)
        args += ["--shards", pattern]
        keys += source_keys
    return args, keys


@pytest.mark.parametrize(
    "data,topologies",
    [
        (one_dataset, [("2x3", 1, 2, 3), ("8x1", 2, 4, 1)]),
        (three_mixed_datasets, [("1x3", 1, 1, 3), ("4x1", 2, 2, 1)]),
    ],
    ids=["one", "mixture"],
)
def test_killed_job_resumes_on_other_topologies(tmp_path, data, topologies):
    """Killed as 2 nodes x 2 ranks x 2 workers; resumed as (nodes x ranks per node, workers)."""
    shards, keys = data(tmp_path)
    workdir = str(tmp_path / "run")
    common = [*shards, "--checkpoint-every", "3"]
    first_logs = str(tmp_path / "keys-first")
    processes = launch(
        2,
        2,
        common + ["--workdir", workdir, "--workers", "2", "--keys-dir", first_logs, "--step-delay", "0.3"],
    )
    checkpoint = os.path.join(workdir, "checkpoint.pt")
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and not (
        os.path.exists(checkpoint) and torch.load(checkpoint, weights_only=False)["step"] >= 6
    ):
        assert all(p.poll() is None for p in processes), "the job ended before it was killed"
        time.sleep(0.1)
    kill(processes)
    step = torch.load(checkpoint, weights_only=False)["step"]
    before, before_pads = trained(read_logs(first_logs), up_to_step=step)
    assert 0 < sum(before.values()) < len(keys) and before_pads == 0

    for name, nnodes, nproc, workers in topologies:
        resumed_dir = str(tmp_path / f"run-{name}")
        shutil.copytree(workdir, resumed_dir)
        logs_dir = str(tmp_path / f"keys-{name}")
        finish(
            launch(
                nnodes,
                nproc,
                common + ["--workdir", resumed_dir, "--workers", str(workers), "--keys-dir", logs_dir],
            )
        )
        after, pads = trained(read_logs(logs_dir))
        assert before + after == Counter(keys), name
        assert pads < nnodes * nproc * workers * len(shards) // 2, name
        assert len(batches_per_rank(read_logs(logs_dir))) == 1, name
