"""wdsx inside trainers, each with the real package: the fetch-ahead tracking Lightning needs,
``torch.distributed.checkpoint`` and Accelerate in one process; and (slow) Lightning killed
with SIGKILL twice, DCP and Accelerate jobs of two ranks under torchrun killed and resumed.
The oracle is always a plain iteration of the same loader."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from types import ModuleType

import numpy as np
import PIL.Image
import pytest
import torch

import wdsx
from wdsx.integrations.tracking import TrackedLoader
from wdsx.write.writer import ShardWriter

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
EXAMPLES = os.path.join(ROOT, "examples")


def keyed(pattern: str, workers: int = 0) -> wdsx.WebLoader:
    dataset = wdsx.WebDataset(pattern, shardshuffle=True).shuffle(10).to_tuple("__key__").batched(4)
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def keys_of(batches) -> list[list[str]]:
    return [list(keys) for (keys,) in batches]


def test_import_wdsx_imports_no_framework():
    code = (
        "import sys, wdsx, wdsx.integrations\n"
        "assert not {'torch', 'lightning', 'accelerate'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def used_then_saved(tracked: TrackedLoader, used: int, ahead: int) -> dict:
    """Consume ``used`` batches the way Lightning does: fetch ``ahead`` batches before using
    one. Returns the state a checkpoint taken then would hold (through JSON)."""
    batches = iter(tracked)
    fetched = [next(batches) for _ in range(ahead)]
    for _ in range(used):
        fetched.append(next(batches, None))
        fetched.pop(0)
        tracked.used()
    return json.loads(json.dumps(tracked.state_dict()))


@pytest.mark.parametrize("ahead", [1, 2])
def test_a_fetch_ahead_consumer_resumes_after_the_batches_it_used(shards, ahead):
    uninterrupted = keyed(shards.pattern)
    oracle = [keys_of(uninterrupted) for _ in range(2)]
    per_epoch = len(oracle[0])

    mid = TrackedLoader(keyed(shards.pattern))
    resumed = TrackedLoader(keyed(shards.pattern))
    resumed.load_state_dict(used_then_saved(mid, 3, ahead))
    assert keys_of(resumed) == oracle[0][3:]

    # at the epoch's last batch: the checkpoint resumes at the next epoch, not in an empty rest
    last = TrackedLoader(keyed(shards.pattern))
    resumed = TrackedLoader(keyed(shards.pattern))
    resumed.load_state_dict(used_then_saved(last, per_epoch, ahead))
    assert keys_of(resumed) == oracle[1]

    # twice in a row: resumed, used further, saved and resumed again
    once = TrackedLoader(keyed(shards.pattern))
    once.load_state_dict(used_then_saved(TrackedLoader(keyed(shards.pattern)), 2, ahead))
    twice = TrackedLoader(keyed(shards.pattern))
    twice.load_state_dict(used_then_saved(once, 5, ahead))
    assert keys_of(twice) == oracle[0][7:]


@pytest.mark.slow
def test_dcp_saves_and_loads_the_loader_in_one_process(shards, tmp_path):
    import torch.distributed.checkpoint as dcp

    from wdsx.integrations.dcp import LoaderStateful

    loader = keyed(shards.pattern, workers=2)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
    dcp.save({"loader": LoaderStateful(loader), "step": 5}, checkpoint_id=str(tmp_path / "ckpt"))
    rest = keys_of(batches)
    resumed = keyed(shards.pattern, workers=2)
    state = {"loader": LoaderStateful(resumed), "step": 0}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    assert state["step"] == 5 and keys_of(resumed) == rest


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_accelerate_prepare_keeps_the_loader_whole_and_in_save_state(shards, tmp_path):
    from accelerate import Accelerator

    from wdsx.integrations.accelerate import AcceleratedLoader, prepare

    accelerator = Accelerator(cpu=True)
    model, loader = prepare(accelerator, torch.nn.Linear(2, 2), keyed(shards.pattern))
    assert isinstance(model, torch.nn.Module) and isinstance(loader, AcceleratedLoader)
    batches = iter(loader)
    first = [next(batches) for _ in range(4)]
    accelerator.save_state(str(tmp_path / "state"))
    rest = keys_of(batches)
    assert sorted(key for keys in keys_of(first) + rest for key in keys) == sorted(shards.keys)
    accelerator.load_state(str(tmp_path / "state"))
    assert keys_of(loader) == rest

    with pytest.raises(ValueError, match="shard its batches across processes again"):
        prepare(accelerator, torch.utils.data.DataLoader(keyed(shards.pattern).dataset, batch_size=None))


# --- slow: real processes, killed with SIGKILL -------------------------------------------------


def image_shards(directory: str) -> str:
    """Two shards of 24 grey 28x28 PNGs with a class each, and a manifest."""
    os.makedirs(directory, exist_ok=True)
    with ShardWriter(os.path.join(directory, "train-%06d.tar"), maxcount=24) as sink:
        for i in range(48):
            out = io.BytesIO()
            PIL.Image.fromarray(((np.arange(784).reshape(28, 28) * 7 + i * 13) % 256).astype(np.uint8)).save(
                out, format="PNG"
            )
            sink.write({"__key__": f"img{i:03d}", "png": out.getvalue(), "cls": i % 10})
    return os.path.join(directory, "train-{000000..000001}.tar")


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def last_record_per_step(path: str) -> list[dict]:
    """Each step's record as the run that completed the training wrote it (a resumed run
    writes again the steps after its checkpoint)."""
    steps: dict[int, dict] = {}
    with open(path) as stream:
        for line in stream:
            record = json.loads(line)
            steps[record["step"]] = record
    assert sorted(steps) == list(range(len(steps)))
    return [steps[step] for step in range(len(steps))]


@pytest.mark.slow
def test_lightning_killed_twice_trains_on_the_uninterrupted_batches(tmp_path):
    shards = image_shards(str(tmp_path / "data"))
    log, workdir = str(tmp_path / "steps.jsonl"), str(tmp_path / "run")
    script = os.path.join(EXAMPLES, "train_lightning.py")

    def fit(*extra: str) -> int:
        command = [sys.executable, script, "--shards", shards, "--workdir", workdir, "--log", log, *extra]
        return subprocess.run(command, start_new_session=True, capture_output=True, timeout=300).returncode

    # 6 steps an epoch, a checkpoint every 3 steps: the first crash resumes from the epoch's
    # last batch (step 6), the second from the middle of the next epoch (step 9)
    assert fit("--crash-after", "7") == -signal.SIGKILL
    assert fit("--crash-after", "10") == -signal.SIGKILL
    assert fit() == 0

    loader = example("train_lightning").build_loader(shards, 8, 2, 0)
    expected = [[list(keys), float(images.sum())] for _ in range(2) for images, _, keys in loader]
    assert [[record["keys"], record["sum"]] for record in last_record_per_step(log)] == expected
    with open(log) as stream:
        trained = Counter(json.loads(line)["step"] for line in stream)
    assert trained[6] == trained[9] == 2  # trained before the crash, and again after the resume


def launch(script: str, args: list[str]) -> int:
    """A torchrun job of two processes on this machine (gloo); its exit status."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=ROOT)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
        "--master_addr=127.0.0.1", f"--master_port={port}", script, *args,
    ]  # fmt: skip
    return subprocess.run(
        command, env=env, start_new_session=True, capture_output=True, timeout=300
    ).returncode


def per_rank_oracle(name: str, shards: str, monkeypatch) -> list[list[list[str]]]:
    """What each of two ranks trains on in two uninterrupted epochs (the rank from the
    environment, as torchrun sets it)."""
    build = example(name).build_loader
    ranks = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = build(shards, 4, 2, 0)
        ranks.append([list(keys) for _ in range(2) for _, _, keys in loader])
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return ranks


@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [("train_dcp", []), ("train_accelerate", ["--cpu"])])
def test_two_rank_job_killed_and_resumed_trains_on_the_uninterrupted_batches(
    tmp_path, monkeypatch, name, extra
):
    shards = image_shards(str(tmp_path / "data"))
    logs, workdir = str(tmp_path / "logs"), str(tmp_path / "run")
    args = ["--shards", shards, "--workdir", workdir, "--log-dir", logs, *extra]
    script = os.path.join(EXAMPLES, f"{name}.py")
    # 6 steps an epoch, a checkpoint every 3 steps: killed after 7, resumed from the epoch's end
    assert launch(script, [*args, "--crash-after", "7"]) != 0
    assert launch(script, args) == 0

    oracle = per_rank_oracle(name, shards, monkeypatch)
    for rank in range(2):
        assert [r["keys"] for r in last_record_per_step(os.path.join(logs, f"rank{rank}.jsonl"))] == oracle[
            rank
        ]
    epoch = Counter(key for rank in range(2) for keys in oracle[rank][:6] for key in keys)
    assert epoch == Counter(f"img{i:03d}" for i in range(48))  # every sample once across ranks: none dropped

    if name == "train_dcp":  # the two ranks' checkpoint, re-dealt to this one process
        import torch.distributed.checkpoint as dcp

        from wdsx.integrations.dcp import LoaderStateful

        loader = example(name).build_loader(shards, 4, 2, 0)
        dcp.load({"loader": LoaderStateful(loader)}, checkpoint_id=os.path.join(workdir, "step-000003"))
        before = Counter(key for rank in range(2) for keys in oracle[rank][:3] for key in keys)
        after = Counter(key for _, _, keys in loader for key in keys)
        assert before + after == epoch
