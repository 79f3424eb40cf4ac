"""Kill the example training script with SIGKILL mid-epoch, restart it, and compare the
sequence of sample keys it trained on with an uninterrupted run's."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import PIL.Image
import pytest

from tests.fixtures.shards import write_tar

pytestmark = pytest.mark.slow  # a training script killed with SIGKILL

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "examples", "train_resumable.py")


def png(value: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.full((28, 28), value % 256, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def make_image_shards(directory: str) -> str:
    for shard in range(4):
        members = []
        for i in range(50):
            key = f"img{shard}_{i:03d}"
            members += [(f"{key}.png", png(shard * 50 + i)), (f"{key}.cls", str(i % 10).encode())]
        write_tar(os.path.join(directory, f"train-{shard:06d}.tar"), members)
    return os.path.join(directory, "train-{000000..000003}.tar")


def command(shards: str, workdir: str, log: str, *extra: str) -> list[str]:
    return [
        sys.executable, SCRIPT, "--shards", shards, "--workdir", workdir, "--keys-log", log,
        "--epochs", "2", "--batch-size", "8", "--workers", "2", "--checkpoint-every", "7", *extra,
    ]  # fmt: skip


def lines(path: str) -> list[str]:
    with open(path) as stream:
        return stream.read().splitlines()


def test_sigkill_and_restart_trains_on_the_uninterrupted_sequence(tmp_path):
    shards = make_image_shards(str(tmp_path))
    reference_log = str(tmp_path / "reference.log")
    subprocess.run(
        command(shards, str(tmp_path / "ref"), reference_log), check=True, timeout=300, capture_output=True
    )
    reference = lines(reference_log)
    trained = Counter(key for line in reference for key in json.loads(line))
    assert set(trained.values()) == {2} and len(trained) == 200  # two epochs of 200 samples

    log = str(tmp_path / "killed.log")
    workdir = str(tmp_path / "run")
    process = subprocess.Popen(
        command(shards, workdir, log, "--step-delay", "0.2"),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if (
            os.path.exists(os.path.join(workdir, "checkpoint.pt"))
            and os.path.exists(log)
            and len(lines(log)) >= 10
        ):
            break
        if process.poll() is not None:
            break
        time.sleep(0.05)
    assert process.poll() is None, "the training run ended before it could be killed"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    killed_at = len(lines(log))
    assert 10 <= killed_at < len(reference)

    result = subprocess.run(
        command(shards, workdir, log), check=True, timeout=300, capture_output=True, text=True
    )
    assert "resumed at epoch" in result.stdout
    assert lines(log) == reference
