"""The client corpus: released packages written for webdataset, run unchanged on wdsx.

For each client (tests/clients/packages.py says which packages and versions, and which
webdataset release each pins), a scenario program sets up the client's own data loading as
its training or inference entry point does and records the batches. It runs twice on shards
this test writes: on the webdataset release the client pins (the oracle), and with
``import webdataset`` resolving to wdsx through ``python -m wdsx.as_webdataset``. Each path
runs with 0 and 2 DataLoader workers, training paths for 2 epochs; timm's training path also
runs with 2 workers started by ``spawn``, which re-import timm and unpickle its dataset.

The batches must be identical where the client's order is deterministic; where it shuffles
with an unseeded generator, each worker's batches of an epoch must hold the same samples, in
batches of the same shapes; where it resamples shards forever (LAVIS), the batches must have
the same shapes and hold only the dataset's samples, intact. One client writes shards (img2dataset): there the
"batches" are the members of the tar it writes, which must be identical.

The packages come from the package index (downloaded once into .cache/clients, never copied
into the repository); the test skips only when the index cannot be reached. Stand-ins, for
what cannot be installed next to this virtualenv's CPU torch: torchvision
(tests/clients/standins/torchvision says why and what it provides), and the package
``__init__`` of clip-retrieval, LAVIS and img2dataset, which import their whole libraries
(their scenario docstrings say so); the data-loading modules themselves run unchanged.
"""

from __future__ import annotations

import os
import pickle
import re
import reprlib
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import wdsx
from tests.clients import shards as dataset
from tests.clients.packages import CLIENTS, SCENARIOS, STANDINS, Client, IndexUnreachable

SCENARIO_CASES = [
    pytest.param(client, path, workers, None, id=f"{client.name}-{path}-{workers}workers")
    for client in CLIENTS
    for path in client.paths
    for workers in client.workers
]
SPAWNED_CASES = [
    pytest.param(
        client, next(iter(client.paths)), 2, "spawn", id=f"{client.name}-{next(iter(client.paths))}-2spawned"
    )
    for client in CLIENTS
    if client.spawn
]
"""The runs whose workers are started by ``spawn``: the longest, run from test_clients_spawned.py
so that the suite's two processes share the corpus."""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("client-shards")
    dataset.write_dataset(str(directory))
    return str(directory)


@pytest.mark.slow
@pytest.mark.parametrize("client, path, workers, start_method", SCENARIO_CASES)
def test_a_client_gets_from_wdsx_the_batches_it_gets_from_its_webdataset(
    client: Client, path: str, workers: int, start_method: str | None, shards: str, tmp_path: Path
):
    compare_scenario(client, path, workers, start_method, shards, tmp_path)


def compare_scenario(
    client: Client, path: str, workers: int, start_method: str | None, shards: str, tmp_path: Path
) -> None:
    """Run one client path on the pinned webdataset and on wdsx, and compare the batches."""
    try:
        sites = [client.site()]
        pinned_site = client.webdataset_site()
    except IndexUnreachable as error:
        pytest.skip(str(error))
    epochs = 2 if path == "train" else 1
    run = Scenario(
        client, shards, sites, path=path, workers=workers, epochs=epochs, start_method=start_method
    )
    pinned = run.on(tmp_path / "pinned", webdataset_site=pinned_site)
    ours = run.on(tmp_path / "wdsx", webdataset_site=None)
    for record, run_on in (pinned, pinned_site), (ours, Path(wdsx.__file__).parent):
        for used in [record["webdataset"], *record["workers_webdataset"]]:
            assert used and Path(used).is_relative_to(run_on), f"ran on {used}, not on {run_on}"
    assert all(pinned["epochs"]), "the oracle run read nothing"
    comparison = client.paths[path]
    if comparison == "same samples":
        same_samples(pinned["epochs"], ours["epochs"], streams=max(1, workers))
    else:
        COMPARISONS[comparison](pinned["epochs"], ours["epochs"])


class Scenario:
    """One client path with a number of workers (started how), and of epochs, run as a
    separate program."""

    def __init__(
        self,
        client: Client,
        shards: str,
        sites: list[Path],
        *,
        path: str,
        workers: int,
        epochs: int,
        start_method: str | None,
    ):
        self.client = client
        self.args = ["--shards", shards, "--path", path, "--workers", str(workers), "--epochs", str(epochs)]
        self.args += ["--start-method", start_method] if start_method else []
        self.sites = ([STANDINS] if client.standins else []) + sites

    def on(self, folder: Path, webdataset_site: Path | None) -> dict[str, Any]:
        """Run on the pinned webdataset in ``webdataset_site``, or on wdsx when it is None."""
        folder.mkdir()
        out = folder / "batches.pkl"
        sites = self.sites + ([webdataset_site] if webdataset_site else [])
        runner = ["-m", "wdsx.as_webdataset"] if webdataset_site is None else []
        command = [
            sys.executable,
            *runner,
            str(SCENARIOS / self.client.scenario),
            *self.args,
            "--out",
            str(out),
        ]
        inherited = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*map(str, sites), *([inherited] if inherited else [])]),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
        }
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
        on = "wdsx" if webdataset_site is None else f"webdataset {self.client.webdataset}"
        if done.returncode != 0:
            pytest.fail(f"{self.client.name} on {on} exited with {done.returncode}:\n{done.stderr[-6000:]}")
        with out.open("rb") as stream:
            return pickle.load(stream)


# --- comparing batches ----------------------------------------------------------------------


def identical(pinned: list[list[Any]], ours: list[list[Any]]) -> None:
    """The same batches, in the same order, value for value."""
    for epoch, (expected, got) in enumerate(zip(pinned, ours, strict=True)):
        for index, (want, have) in enumerate(zip(expected, got)):
            if not same(want, have):
                pytest.fail(
                    f"epoch {epoch}, batch {index} differs:\n"
                    f"  webdataset: {describe(want)}\n  wdsx:       {describe(have)}\n"
                    f"webdataset's batches: {[describe(batch) for batch in expected]}\n"
                    f"wdsx's batches:       {[describe(batch) for batch in got]}"
                )
        assert len(got) == len(expected), (
            f"epoch {epoch}: {len(got)} batches, webdataset gives {len(expected)}"
        )


def same_samples(pinned: list[list[Any]], ours: list[list[Any]], streams: int = 1) -> None:
    """Each epoch: batches of the same shapes; each of the ``streams`` workers' batches (the
    DataLoader takes one from each worker in turn) holding the same samples."""
    for epoch, (expected, got) in enumerate(zip(pinned, ours, strict=True)):
        assert [shapes(batch) for batch in got] == [shapes(batch) for batch in expected], f"epoch {epoch}"
        for worker in range(streams):
            missing = Counter(samples(expected[worker::streams])) - Counter(samples(got[worker::streams]))
            extra = Counter(samples(got[worker::streams])) - Counter(samples(expected[worker::streams]))
            assert not missing and not extra, (
                f"epoch {epoch}, worker {worker}: wdsx lacks {sorted(sample_names(missing))}, "
                f"adds {sorted(sample_names(extra))}"
            )


def resampled(pinned: list[list[Any]], ours: list[list[Any]]) -> None:
    """Batches of the same shapes; every sample is one the test wrote, whole (the same image
    under the same caption in both runs)."""
    for epoch, (expected, got) in enumerate(zip(pinned, ours, strict=True)):
        assert [shapes(batch) for batch in got] == [shapes(batch) for batch in expected], f"epoch {epoch}"
    rows = [row for epochs in (pinned, ours) for batches in epochs for row in samples(batches)]
    known = {dataset.caption(key).upper() for key in dataset.KEYS}
    assert {name for row in rows for name in row if isinstance(name, str)} <= known
    images_by_caption: dict[tuple, set] = {}
    for row in rows:
        texts = tuple(item for item in row if isinstance(item, str))
        images_by_caption.setdefault(texts, set()).add(row)
    assert all(len(images) == 1 for images in images_by_caption.values())


COMPARISONS = {"identical": identical, "same samples": same_samples, "resampled": resampled}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def shapes(batch: Any) -> Any:
    """A batch's structure: field names, array dtypes and shapes, list lengths."""
    if isinstance(batch, np.ndarray):
        return (str(batch.dtype), batch.shape)
    if isinstance(batch, dict):
        return {key: shapes(value) for key, value in batch.items()}
    if isinstance(batch, list) and batch and all(isinstance(item, str) for item in batch):
        return ("strings", len(batch))
    if isinstance(batch, list):
        return [shapes(item) for item in batch]
    return type(batch).__name__


def fields(batch: Any) -> list[Any]:
    """A batch's fields, each an array or list with one entry per sample, in a fixed order."""
    if isinstance(batch, dict):
        return [field for key in sorted(batch) for field in fields(batch[key])]
    if isinstance(batch, list) and batch and not all(isinstance(item, str) for item in batch):
        return [field for item in batch for field in fields(item)]
    return [batch]


def samples(batches: list[Any]) -> list[tuple]:
    """Every sample of the batches as a hashable row: its entry in each field."""
    rows = []
    for batch in batches:
        columns = fields(batch)
        for index in range(len(columns[0])):
            rows.append(tuple(entry(column[index]) for column in columns))
    return rows


def entry(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.shape, value.tobytes())
    return value


def sample_names(rows: Counter) -> list[str]:
    return [name for row in rows.elements() for name in names_in(row)]


def names_in(value: Any) -> list[str]:
    """The sample keys a value names: in a caption, in caption tokens, or by an image's colour."""
    if isinstance(value, tuple) and len(value) == 3 and isinstance(value[2], bytes):
        array = np.frombuffer(value[2], dtype=value[0]).reshape(value[1])
        return names_in(array)
    if isinstance(value, np.ndarray) and value.dtype == np.float32 and value.shape[-3:] == (3, 8, 8):
        return [nearest_colour(image[:, 0, 0] * 255) for image in value.reshape(-1, 3, 8, 8)]
    if isinstance(value, np.ndarray) and value.dtype == np.int64:
        rows = value.reshape(-1, value.shape[-1]) if value.ndim else value.reshape(1, 1)
        return [name for row in rows for name in names_in("".join(chr(code) for code in row if code))]
    if isinstance(value, str):
        return re.findall(r"sample (\S+)", value, flags=re.IGNORECASE)
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in names_in(item)]
    if isinstance(value, dict):
        return [name for item in value.values() for name in names_in(item)]
    return []


def nearest_colour(rgb: np.ndarray) -> str:
    """The key of the sample whose colour is nearest (JPEG shifts colours a little)."""
    colours = np.array([dataset.colour(index) for index in range(len(dataset.KEYS))], dtype=np.float32)
    return dataset.KEYS[int(np.abs(colours - rgb).sum(axis=1).argmin())]


def describe(batch: Any) -> str:
    """A batch in a failure message: the samples it holds."""
    return " ".join(dict.fromkeys(names_in(batch))) or reprlib.repr(batch)
