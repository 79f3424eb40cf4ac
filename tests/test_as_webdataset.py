"""``wdsx.as_webdataset``: unchanged programs that ``import webdataset`` run on wdsx.

Each check runs a small program in a fresh interpreter (the hook changes how ``webdataset``
imports, which must not leak into this test process, where webdataset is the oracle). The
programs report what they saw as JSON on their last line of output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import wdsx
from wdsx.as_webdataset import WEBDATASET_MODULES

pytestmark = pytest.mark.slow  # each test starts Python programs in subprocesses

REAL_WEBDATASET = Path(__import__("webdataset").__file__).parent


def run(tmp_path: Path, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


MODULE_MAP = f"""
    import importlib, json, sys, types
    MODULES = {sorted(WEBDATASET_MODULES)!r}
    import webdataset
    import webdataset.gopen
    from webdataset.tariterators import tar_file_expander
    import wdsx
    modules = {{}}
    for name in sorted(MODULES):
        try:
            module = importlib.import_module("webdataset." + name)
        except ModuleNotFoundError:
            modules[name] = None
        else:
            modules[name] = module is sys.modules.get("wdsx." + name)
    print(json.dumps({{
        "same": webdataset is wdsx,
        "spec": webdataset.__spec__.name,
        "gopen_is_function": not isinstance(webdataset.gopen, types.ModuleType),
        "expander": tar_file_expander is wdsx.tariterators.tar_file_expander,
        "modules": modules,
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
    }}))
"""


def test_a_script_run_by_the_runner_imports_wdsx_as_webdataset(tmp_path):
    folder = tmp_path / "programs"
    folder.mkdir()
    script = write(folder / "train.py", MODULE_MAP)
    seen = report(run(tmp_path, ["-m", "wdsx.as_webdataset", str(script), "--lr", "3"]))
    assert seen["same"] and seen["expander"] and seen["gopen_is_function"]
    assert seen["spec"] == "wdsx"
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(script), "--lr", "3"]
    assert seen["path0"] == str(folder)
    # Every webdataset module name is wdsx's face where wdsx has one, and otherwise an
    # ImportError (so a `try: import ... except ImportError:` fallback runs).
    for name, is_face in seen["modules"].items():
        has_face = (Path(wdsx.__file__).parent / f"{name}.py").exists() or (
            Path(wdsx.__file__).parent / name / "__init__.py"
        ).exists()
        assert is_face == (True if has_face else None), name


def test_a_module_run_by_the_runner_sees_what_python_m_gives_it(tmp_path):
    package = tmp_path / "trainer"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package / "main.py", MODULE_MAP)
    seen = report(run(tmp_path, ["-m", "wdsx.as_webdataset", "-m", "trainer.main", "x"]))
    assert seen["same"] and seen["name"] == "__main__"
    assert seen["argv"] == [str(package / "main.py"), "x"]


@pytest.mark.slow
def test_without_the_runner_the_same_program_gets_the_real_webdataset(tmp_path):
    script = write(tmp_path / "train.py", MODULE_MAP)
    seen = report(run(tmp_path, [str(script)]))
    assert not seen["same"]


def test_exit_status_and_errors_pass_through(tmp_path):
    script = write(tmp_path / "fails.py", "raise SystemExit(3)\n")
    assert run(tmp_path, ["-m", "wdsx.as_webdataset", str(script)]).returncode == 3
    script = write(tmp_path / "raises.py", "raise ValueError('bad config')\n")
    done = run(tmp_path, ["-m", "wdsx.as_webdataset", str(script)])
    assert done.returncode == 1 and "ValueError: bad config" in done.stderr
    done = run(tmp_path, ["-m", "wdsx.as_webdataset"])
    assert done.returncode == 2 and "usage:" in done.stderr


def test_importing_the_module_imports_neither_torch_nor_webdataset(tmp_path):
    probe = "import sys, wdsx.as_webdataset; print(sorted({'torch', 'webdataset'} & set(sys.modules)))"
    assert run(tmp_path, ["-c", probe]).stdout.strip() == "[]"


def test_installing_after_webdataset_was_imported_says_so(tmp_path):
    probe = "import webdataset, wdsx.as_webdataset; wdsx.as_webdataset.install()"
    done = run(tmp_path, ["-c", probe])
    assert done.returncode == 1
    assert "ImportError: webdataset is already imported" in done.stderr
    assert str(REAL_WEBDATASET) in done.stderr


WORKERS = """
    import json, sys
    import torch.utils.data
    from probe import Probe

    if __name__ == "__main__":
        seen = {}
        for method in %r:
            loader = torch.utils.data.DataLoader(
                Probe(), batch_size=None, num_workers=2, multiprocessing_context=method
            )
            seen[method] = sorted(tuple(item) for item in loader)
        print(json.dumps(seen))
"""

PROBE = """
    import sys
    import torch.utils.data
    import webdataset

    class Probe(torch.utils.data.IterableDataset):
        def __iter__(self):
            worker = torch.utils.data.get_worker_info().id
            yield worker, webdataset.__name__, sys.modules["webdataset"] is sys.modules.get("wdsx")
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_see_the_hook(tmp_path, method):
    """A spawned or forkserver worker re-imports the program's modules (here, ``probe``, which
    imports webdataset at its top) before it unpickles the dataset: it must get wdsx too."""
    write(tmp_path / "probe.py", PROBE)
    script = write(tmp_path / "loader.py", WORKERS % ([method],))
    seen = report(run(tmp_path, ["-m", "wdsx.as_webdataset", str(script)], timeout=240))
    assert seen[method] == [[0, "wdsx", True], [1, "wdsx", True]]
    seen = report(run(tmp_path, [str(script)], timeout=240))
    assert seen[method] == [[0, "webdataset", False], [1, "webdataset", False]]


@pytest.mark.slow
def test_torchrun_runs_the_runner_on_every_rank(tmp_path):
    script = write(
        tmp_path / "ranks.py",
        """
        import json, os, sys
        import webdataset, wdsx
        print(json.dumps({"rank": os.environ["RANK"], "same": webdataset is wdsx, "argv": sys.argv[1:]}))
        """,
    )
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [str(torchrun), "--nproc-per-node=2", "-m", "wdsx.as_webdataset", str(script), "--flag"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(rank["rank"] for rank in ranks) == ["0", "1"]
    assert all(rank["same"] and rank["argv"] == ["--flag"] for rank in ranks)
