"""The released packages the client corpus runs, fetched from the package index and cached.

Nothing here is copied into the repository: the wheels are downloaded with
``pip download --no-deps`` into ``.cache/clients/wheels`` (source archives into
``.cache/clients/sdists``; both git-ignored, removed by ``make clean``) and installed with
``pip install --no-deps --target`` into one folder per set of packages under
``.cache/clients/site``. ``--no-deps`` everywhere keeps the virtualenv's torch
in place: the clients' own requirements would replace it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
CACHE = REPOSITORY / ".cache" / "clients"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
STANDINS = Path(__file__).resolve().parent / "standins"

# Words in pip's output that mean the index could not be reached (rather than, say, a
# version that does not exist, which is a failure of the test itself).
_UNREACHABLE = (
    "NewConnectionError",
    "Max retries exceeded",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "Connection refused",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
)


class IndexUnreachable(Exception):
    """The package index could not be reached, and the wheel is not in the cache."""


@dataclass(frozen=True)
class Client:
    """A released package whose data-loading code the corpus runs unchanged.

    ``webdataset`` is the version its users get: the newest release its requirement allows
    (``pins`` says which requirement). ``paths`` maps each of its data paths the scenario
    runs to how its batches are compared (see tests/test_clients.py). ``extras`` are
    packages its data-loading modules import that the virtualenv lacks; ``standins`` names
    the stand-ins it needs from tests/clients/standins (for what cannot be installed here).
    ``workers`` are the DataLoader worker counts its paths run with (none for a writer);
    ``spawn`` adds a run of its first path whose 2 workers start by ``spawn`` rather than
    ``fork`` (so they re-import the client and unpickle its dataset under the hook).
    """

    name: str
    requirement: str
    pins: str
    webdataset: str
    scenario: str
    paths: dict[str, str]
    extras: tuple[str, ...] = ()
    standins: tuple[str, ...] = ()
    workers: tuple[int, ...] = (0, 2)
    spawn: bool = False

    def site(self) -> Path:
        """The folder holding the client and its extras, installed."""
        return installed((self.requirement, *self.extras))

    def webdataset_site(self) -> Path:
        """The folder holding the webdataset release the client runs on."""
        return installed((f"webdataset=={self.webdataset}",))


CLIENTS = (
    Client(
        name="open_clip",
        requirement="open_clip_torch==3.3.0",
        pins="open_clip_torch[training] requires webdataset>=0.2.5,<=0.2.86",
        webdataset="0.2.86",
        scenario="open_clip_train_data.py",
        paths={"train": "same samples", "val": "identical"},
        extras=("pandas==3.1.1",),
        standins=("torchvision",),
    ),
    Client(
        name="timm",
        requirement="timm==1.0.31",
        pins="timm imports webdataset when present and pins no version",
        webdataset="1.0.2",
        scenario="timm_reader_wds.py",
        paths={"train": "identical", "val": "identical"},
        standins=("torchvision",),
        spawn=True,
    ),
    Client(
        name="clip_retrieval",
        requirement="clip-retrieval==2.45.0",
        pins="clip-retrieval requires webdataset>=0.2,<0.3",
        webdataset="0.2.111",
        scenario="clip_retrieval_reader.py",
        paths={"inference": "identical"},
    ),
    Client(
        name="lavis",
        requirement="salesforce-lavis==1.0.2",
        pins="salesforce-lavis requires webdataset, any version",
        webdataset="1.0.2",
        scenario="lavis_laion_dataset.py",
        paths={"train": "resampled"},
    ),
    Client(
        name="img2dataset",
        requirement="img2dataset==1.47.0",
        pins="img2dataset requires webdataset>=0.2.5,<0.3",
        webdataset="0.2.111",
        scenario="img2dataset_writer.py",
        paths={"write": "identical"},
        extras=("pyarrow==26.0.1",),
        workers=(0,),
    ),
)


def installed(requirements: tuple[str, ...]) -> Path:
    """A folder with exactly these ``name==version`` packages installed, made once and cached."""
    digest = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:12]
    target = CACHE / "site" / f"{requirements[0].replace('==', '-')}-{digest}"
    if target.is_dir():
        return target
    wheels = [str(wheel(requirement)) for requirement in requirements]
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    _pip("install", "--no-deps", "--no-index", "--no-compile", "--target", str(staging), *wheels)
    try:
        staging.rename(target)
    except OSError:  # another test process finished the same folder first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def wheel(requirement: str) -> Path:
    """The wheel of ``requirement`` (``name==version``), downloaded once into the cache."""
    return _downloaded(requirement, "wheels", "--only-binary=:all:", "*.whl")


def source_distribution(requirement: str) -> Path:
    """The source archive of ``requirement``, downloaded once into the cache: the tests a
    project ships are in it, not in its wheel."""
    return _downloaded(requirement, "sdists", "--no-binary=:all:", "*.tar.gz")


def _downloaded(requirement: str, kind: str, choice: str, pattern: str) -> Path:
    """The file ``pip download`` gives for ``requirement`` with the ``choice`` option, kept
    under ``.cache/clients/<kind>``."""
    folder = CACHE / kind / requirement.replace("==", "-")
    found = sorted(folder.glob(pattern))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".download.", dir=folder))  # test processes may race
    try:
        _pip(
            "download",
            "--no-deps",
            choice,
            "--timeout",
            "30",
            "--retries",
            "2",
            "--dest",
            str(staging),
            requirement,
        )
        for downloaded in staging.glob(pattern):
            os.replace(downloaded, folder / downloaded.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    found = sorted(folder.glob(pattern))
    if not found:
        raise RuntimeError(f"pip download {requirement} left no {pattern} in {folder}")
    return found[0]


def _pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_NO_INPUT": "1"},
    )
    if done.returncode == 0:
        return
    output = done.stdout + done.stderr
    if any(word in output for word in _UNREACHABLE):
        raise IndexUnreachable(f"the package index cannot be reached (pip {args[0]}):\n{output[-2000:]}")
    raise RuntimeError(f"pip {' '.join(args)} failed:\n{output[-4000:]}")
