"""The Ray side of the shard writer, on a real two-node Ray cluster on this machine: the Ray
engine (every shard job a Ray task), its output against the local engine's, a Ray worker killed
mid-shard, and the Ray Data sink."""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import signal
import tarfile
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need Ray: pip install -e '.[ray]'")

import wdsx  # noqa: E402
from tests.fixtures.raycluster import RayCluster, ray_cluster  # noqa: E402
from tests.fixtures.rayjobs import HOLD, gated_sample, mixed_sample  # noqa: E402
from wdsx.read.manifest import Manifest  # noqa: E402
from wdsx.write.dataset import write_dataset  # noqa: E402
from wdsx.write.engines.ray import run_on_ray  # noqa: E402
from wdsx.write.jobs import JobRunner, WriteError  # noqa: E402
from wdsx.write.plan import plan_writes  # noqa: E402

pytestmark = pytest.mark.slow  # starts a Ray cluster (several processes per node)


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    with ray_cluster() as running:
        yield running


@pytest.fixture
def driver(cluster: RayCluster) -> Iterator[RayCluster]:
    """This process connected to the cluster for the test's length."""
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()


def final_files(directory: str) -> dict[str, bytes]:
    """Every file under a final name in ``directory`` (hidden records and partials left out)."""
    return {
        name: open(os.path.join(directory, name), "rb").read()
        for name in sorted(os.listdir(directory))
        if not name.startswith(".")
    }


def tar_samples(path: str) -> int:
    """How many samples the shard at ``path`` holds, read fully by Python's tarfile."""
    with tarfile.open(path) as tar:
        members = tar.getmembers()
        for member in members:
            tar.extractfile(member).read()  # type: ignore[union-attr]
    return len({member.name.split(".", 1)[0] for member in members})


def test_run_on_ray_runs_every_job_on_the_cluster(cluster: RayCluster, tmp_path) -> None:
    plan = plan_writes(list(range(12)), str(tmp_path / "a-%06d.tar"), maxcount=2)
    seen: list[int] = []
    records = run_on_ray(plan.jobs, JobRunner(mixed_sample), address=cluster.address, progress=seen.append)
    assert not ray.is_initialized()  # it connected, so it disconnected
    assert sorted(record["shard"]["name"] for record in records) == [f"a-{n:06d}.tar" for n in range(6)]
    assert sum(seen) == 12
    for record in records:
        path = tmp_path / record["shard"]["name"]
        assert tar_samples(str(path)) == record["shard"]["samples"] == 2
        assert hashlib.sha256(path.read_bytes()).hexdigest() == record["shard"]["sha256"]


def test_run_on_ray_leaves_the_callers_ray_connected(driver: RayCluster, tmp_path) -> None:
    plan = plan_writes([1, 2, 3], str(tmp_path / "b-%06d.tar"), maxcount=2)
    records = run_on_ray(plan.jobs, JobRunner(mixed_sample), address="ray://nowhere:1")
    assert ray.is_initialized()
    assert len(records) == 2
    with pytest.raises(WriteError, match="strict"):  # a job's own error reaches the caller
        run_on_ray(plan.jobs, JobRunner(lambda n: {"txt": object()}, strict=True))


def test_ray_engine_writes_the_local_engines_bytes(cluster: RayCluster, tmp_path) -> None:
    inputs = list(range(23))
    settings = dict(maxcount=4, extra={"classes": ["a", "b"]})
    on_ray = write_dataset(
        inputs, mixed_sample, str(tmp_path / "ray/d"), engine="ray", ray_address=cluster.address, **settings
    )
    assert on_ray.written == on_ray.shards == 6 and on_ray.samples == 23
    expected = final_files(str(tmp_path / "ray"))
    assert len(expected) == 7  # six shards and the manifest
    for workers in (1, 2):
        write_dataset(inputs, mixed_sample, str(tmp_path / f"local{workers}/d"), workers=workers, **settings)
        assert final_files(str(tmp_path / f"local{workers}")) == expected
    manifest = Manifest.from_json(expected["d.manifest.json"])
    assert [shard.name for shard in manifest.shards] == [f"d-{n:06d}.tar" for n in range(6)]
    for shard in manifest.shards:
        assert tar_samples(str(tmp_path / "ray" / shard.name)) == shard.samples


class TarWatcher(threading.Thread):
    """Parses every final-named ``.tar`` in a directory, over and over, until stopped; keeps
    the first failure (a truncated shard under a final name)."""

    def __init__(self, directory: str):
        super().__init__(daemon=True)
        self.directory = directory
        self.stopped = threading.Event()
        self.failure: str | None = None
        self.rounds = 0

    def run(self) -> None:
        while not self.stopped.is_set() and self.failure is None:
            for path in glob.glob(os.path.join(self.directory, "*.tar")):
                try:
                    tar_samples(path)
                except FileNotFoundError:
                    continue
                except Exception as exn:  # tarfile's errors, EOF in a member...
                    self.failure = f"{path}: {type(exn).__name__}: {exn}"
            self.rounds += 1
            time.sleep(0.02)


def wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_killed_ray_worker_then_rerun_rewrites_only_unfinished_shards(cluster: RayCluster, tmp_path) -> None:
    """The last shard's Ray worker is SIGKILLed mid-shard on every attempt Ray makes, so the run
    fails; the re-run writes that shard only, and the result is the bytes of an uninterrupted
    run. Meanwhile, every shard under a final name parses whole."""
    gate, out = tmp_path / "gate", tmp_path / "out"
    gate.mkdir()
    out.mkdir()
    gated = 7  # the last input of the last shard
    inputs = [(number, str(gate), gated) for number in range(8)]
    clean = write_dataset(inputs, gated_sample, str(tmp_path / "clean/k"), maxcount=2)
    assert clean.written == 4
    for marker in gate.iterdir():  # the clean run's own pass through the gated input
        marker.unlink()
    (gate / HOLD).touch()
    watcher = TarWatcher(str(out))
    watcher.start()
    outcome: dict[str, object] = {}

    def first_run() -> None:
        try:
            outcome["report"] = write_dataset(
                inputs, gated_sample, str(out / "k"), maxcount=2, engine="ray", ray_address=cluster.address
            )
        except BaseException as exn:
            outcome["error"] = exn

    runner = threading.Thread(target=first_run, daemon=True)
    runner.start()
    try:
        finished_before = kill_every_attempt(cluster, gate, out)
        runner.join(timeout=120)
        assert not runner.is_alive()
        assert isinstance(outcome.get("error"), ray.exceptions.RayError), outcome
        assert not (out / "k.manifest.json").exists()
        assert not (out / "k-000003.tar").exists()
        (gate / HOLD).unlink()
        rerun = write_dataset(
            inputs, gated_sample, str(out / "k"), maxcount=2, engine="ray", ray_address=cluster.address
        )
    finally:
        (gate / HOLD).unlink(missing_ok=True)
        watcher.stopped.set()
        watcher.join(timeout=60)
    assert watcher.failure is None and watcher.rounds > 0
    assert (rerun.written, rerun.reused, rerun.samples) == (1, 3, 8)
    for name, before in finished_before.items():
        after = os.stat(out / name)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert final_files(str(out)) == final_files(str(tmp_path / "clean"))
    assert not [name for name in os.listdir(out) if name.endswith(".partial")]


def kill_every_attempt(cluster: RayCluster, gate, out) -> dict[str, os.stat_result]:
    """SIGKILL the Ray worker holding the gated input, on each of the attempts Ray makes;
    returns the state of the other shards, found complete before the first kill."""
    killed: set[int] = set()
    attempts = 4  # run_on_ray's default: three retries after the first attempt
    for attempt in range(attempts):
        started = lambda count=attempt + 1: len(os.listdir(gate)) > count  # the hold file and markers
        wait_for(started, f"attempt {attempt + 1} of the gated shard")
        (pid,) = {
            int(name.split("-")[1]) for name in os.listdir(gate) if name.startswith("started-")
        } - killed
        if attempt == 0:
            wait_for(lambda: len(glob.glob(str(out / "k-*.tar"))) == 3, "the three other shards")
            finished_before = {
                name: os.stat(out / name) for name in ("k-000000.tar", "k-000001.tar", "k-000002.tar")
            }
        assert pid in cluster.worker_processes()
        os.kill(pid, signal.SIGKILL)
        killed.add(pid)
    return finished_before


@pytest.fixture(scope="module")
def data_driver(cluster: RayCluster) -> Iterator[RayCluster]:
    """This process connected to the cluster once for every Ray Data test, as a Ray Data
    program is: Ray Data leaves actors of its own on the cluster for the next datasets."""
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def sink_class(data_driver: RayCluster) -> type:
    """ShardSink (imported here: Ray Data takes a while to import, and needs pyarrow)."""
    pytest.importorskip("ray.data", reason="the Ray Data sink needs ray[data] and pyarrow")
    from wdsx.write.raysink import ShardSink

    return ShardSink


def test_shard_sink_writes_a_ray_dataset_as_shards(sink_class: type, tmp_path) -> None:
    from ray.data import DataContext

    options = DataContext.get_current().execution_options
    preserve_order, options.preserve_order = options.preserve_order, True
    items = [
        {
            "__key__": f"s{number:04d}",
            "txt": f"text {number}",
            "cls": number % 3,
            "json": {"number": number},
            "npy": np.full(3, number, dtype=np.int16),
            "bin": bytes([number]) * (number + 1),
        }
        for number in range(40)
    ]
    sink = sink_class(str(tmp_path / "train-%06d.tar"), maxcount=6, extra={"classes": ["x", "y", "z"]})
    try:
        ray.data.from_items(items, override_num_blocks=4).write_datasink(sink)
    finally:
        options.preserve_order = preserve_order

    names = sorted(name for name in os.listdir(tmp_path))
    shards = [name for name in names if name.endswith(".tar")]
    assert names == [*shards, "train.manifest.json"]  # no staging directory or partial file left
    assert shards == [f"train-{n:06d}.tar" for n in range(len(shards))]
    manifest = Manifest.load(str(tmp_path / "train.manifest.json"))
    assert manifest is not None and manifest.extra == {"classes": ["x", "y", "z"]}
    assert [entry.name for entry in manifest.shards] == shards
    for entry in manifest.shards:
        path = tmp_path / entry.name
        assert entry.samples == tar_samples(str(path)) <= 6
        assert entry.bytes == path.stat().st_size
        assert entry.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()

    read = list(wdsx.WebDataset([str(tmp_path / name) for name in shards], shardshuffle=False))
    assert [sample["__key__"] for sample in read] == [item["__key__"] for item in items]
    for sample, item in zip(read, items):
        assert sample["txt"] == item["txt"].encode()
        assert sample["cls"] == str(item["cls"]).encode()
        assert json.loads(sample["json"]) == item["json"]
        assert np.array_equal(np.load(io.BytesIO(sample["npy"])), item["npy"])
        assert sample["bin"] == item["bin"]


def test_shard_sink_makes_keys_when_rows_have_none(sink_class: type, tmp_path) -> None:
    ray.data.from_items([{"txt": f"row {n}"} for n in range(5)], override_num_blocks=1).write_datasink(
        sink_class(str(tmp_path / "k-%03d.tar"), maxcount=3)
    )
    read = list(
        wdsx.WebDataset([str(tmp_path / "k-000.tar"), str(tmp_path / "k-001.tar")], shardshuffle=False)
    )
    assert [(sample["__key__"], sample["txt"]) for sample in read] == [
        (f"000000_{n:09d}", f"row {n}".encode()) for n in range(5)
    ]
