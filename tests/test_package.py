"""The package as others see it: what ``from wdsx import *`` gives, where the version is
written, the install hints of error messages, and (slow) a wheel built from this tree and
installed into a fresh virtual environment."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import types
import zipfile

import pytest
import tomllib
import webdataset

import wdsx
from wdsx.core.extras import extra_packages, install_hint

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGE = os.path.join(ROOT, "wdsx")


def pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as stream:
        return tomllib.load(stream)


def written_all() -> ast.expr:
    """The expression assigned to ``__all__`` in wdsx/__init__.py, as written."""
    with open(os.path.join(PACKAGE, "__init__.py")) as stream:
        tree = ast.parse(stream.read())
    assigned = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    ]
    assert len(assigned) == 1, "__all__ is assigned once"
    return assigned[0]


def test_all_is_a_sorted_literal_list_of_names():
    value = written_all()
    assert isinstance(value, ast.List) and all(isinstance(item, ast.Constant) for item in value.elts)
    names = [item.value for item in value.elts]  # type: ignore[attr-defined]
    assert names == wdsx.__all__ == sorted(wdsx.__all__)
    assert len(set(names)) == len(names)


def test_star_import_gives_the_public_names_and_no_module():
    namespace: dict = {}
    exec("from wdsx import *", namespace)
    imported = {name for name in namespace if name != "__builtins__"}
    assert imported == set(wdsx.__all__)
    modules = [name for name in imported if isinstance(namespace[name], types.ModuleType)]
    assert modules == []
    packages = {
        entry.name for entry in os.scandir(PACKAGE) if os.path.isfile(os.path.join(entry, "__init__.py"))
    }
    assert {"core", "read", "sources", "state", "write", "loader"} <= packages
    assert not packages & imported


def test_all_has_every_public_name_of_webdataset():
    """webdataset 1.0.2 has no ``__all__``: its star import gives every public attribute. Each
    that is not a module is in ours, but for the live setting ``pytorch_weights_only`` (read
    from ``wdsx.pytorch_weights_only`` each time; a star import would freeze a copy)."""
    theirs = {
        name
        for name in dir(webdataset)
        if not name.startswith("_") and not isinstance(getattr(webdataset, name), types.ModuleType)
    }
    assert theirs - set(wdsx.__all__) == {"pytorch_weights_only"}
    assert isinstance(wdsx.pytorch_weights_only, bool)


def test_webdataset_module_names_stay_reachable_as_attributes():
    for name in ("autodecode", "cache", "filters", "shardlists", "tariterators", "tenbin", "writer"):
        assert isinstance(getattr(wdsx, name), types.ModuleType), name


def test_the_version_is_written_once():
    project = pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "wdsx.version.__version__"}
    with open(os.path.join(PACKAGE, "version.py")) as stream:
        tree = ast.parse(stream.read())
    (assignment,) = [node for node in tree.body if isinstance(node, ast.Assign)]
    assert wdsx.__version__ == assignment.value.value  # type: ignore[attr-defined]


def test_license_and_typing_marker_ship():
    project = pyproject()
    assert project["project"]["license"] == "MIT"
    with open(os.path.join(ROOT, "LICENSE")) as stream:
        assert "MIT License" in stream.read()
    assert os.path.exists(os.path.join(PACKAGE, "py.typed"))
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["wdsx"]


@pytest.mark.parametrize("extra", ["zstd", "s3", "gcs", "azure", "fsspec", "lmdb"])
def test_install_hints_name_what_the_extra_installs(extra):
    declared = pyproject()["project"]["optional-dependencies"][extra]
    names = [spec.split(">")[0].split("=")[0].split("<")[0] for spec in declared]
    assert extra_packages(extra) == names
    hint = install_hint(extra, "unused")
    assert f"pip install {' '.join(names)}" in hint and f"pip install -e '.[{extra}]'" in hint


def test_install_hints_in_the_code_work_from_a_checkout():
    """No message tells a user to ``pip install 'wdsx[...]'``, which fetches another wdsx."""
    offenders = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as stream:
                    text = stream.read()
                if "install 'wdsx[" in text or "install wdsx[" in text:
                    offenders.append(name)
    assert offenders == []


def test_reading_zst_without_zstandard_says_how_to_install_it(tmp_path, monkeypatch):
    import zstandard

    path = tmp_path / "rows.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b'{"a": 1}\n'))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now fails
    with pytest.raises(wdsx.ShardError) as caught:
        list(wdsx.WebDataset(str(path), shardshuffle=False))
    assert "pip install zstandard" in str(caught.value)
    assert "pip install -e '.[zstd]' in a wdsx checkout" in str(caught.value)


# --- a wheel, installed ---------------------------------------------------------------------

QUICK_START = """
import importlib.metadata, json, sys, tarfile
import wdsx

with wdsx.TarWriter(sys.argv[1]) as sink:
    for i in range(3):
        sink.write({"__key__": f"sample{i}", "txt": f"text {i}", "cls": i})
read = [(s["__key__"], s["txt"], s["cls"]) for s in wdsx.WebDataset(sys.argv[1], shardshuffle=False).decode()]
with tarfile.open(sys.argv[1]) as archive:
    members = archive.getnames()
versions = [wdsx.__version__, importlib.metadata.version("wdsx")]
print(json.dumps({"file": wdsx.__file__, "read": read, "members": members, "versions": versions}))
"""


def _source_tree(destination: str) -> str:
    """The files a build reads, copied out of the working tree (a build writes beside them)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(PACKAGE, os.path.join(destination, "wdsx"), ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(os.path.join(ROOT, name), destination)
    return destination


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_installs_into_a_fresh_environment_and_runs(tmp_path):
    source = _source_tree(str(tmp_path / "source"))
    dist = str(tmp_path / "dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source],
        check=True,
        capture_output=True,
    )
    version = wdsx.__version__
    wheel = os.path.join(dist, f"wdsx-{version}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"wdsx/py.typed", "wdsx/__init__.py", "wdsx/version.py", "wdsx/commands/cli.py"} <= names
    assert f"wdsx-{version}.dist-info/licenses/LICENSE" in names
    with tarfile.open(os.path.join(dist, f"wdsx-{version}.tar.gz")) as archive:
        assert {f"wdsx-{version}/LICENSE", f"wdsx-{version}/wdsx/py.typed"} <= set(archive.getnames())

    # A fresh environment whose own site-packages (with the wheel) comes first; the project's
    # installed packages (numpy, Pillow...) are reached through a .pth line, so nothing is
    # downloaded. The project's own editable wdsx is not: .pth files of a directory named in a
    # .pth line are not processed.
    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with open(os.path.join(purelib, "project-packages.pth"), "w") as stream:
        stream.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
    )

    script = tmp_path / "quick_start.py"
    script.write_text(QUICK_START)
    shard = str(tmp_path / "tiny.tar")
    ran = subprocess.run(
        [python, str(script), shard], cwd=str(tmp_path), check=True, capture_output=True, text=True
    )
    result = json.loads(ran.stdout)
    assert result["file"].startswith(purelib), result["file"]
    assert result["versions"] == [version, version]  # the package's and its metadata's: one source
    assert result["read"] == [[f"sample{i}", f"text {i}", i] for i in range(3)]
    assert sorted(result["members"]) == [f"sample{i}.{ext}" for i in range(3) for ext in ("cls", "txt")]

    helped = subprocess.run(
        [os.path.join(venv, "bin", "wdsx"), "--help"], cwd=str(tmp_path), capture_output=True, text=True
    )
    assert helped.returncode == 0, helped.stderr
    assert all(command in helped.stdout for command in ("verify", "preview", "ls", "convert"))
    told = subprocess.run([os.path.join(venv, "bin", "wdsx"), "--version"], capture_output=True, text=True)
    assert told.stdout == f"wdsx {version}\n"
    typed = subprocess.run(
        [
            python,
            "-c",
            "import importlib.resources as r; print(r.files('wdsx').joinpath('py.typed').is_file())",
        ],
        cwd=str(tmp_path),
        check=True,
        capture_output=True,
        text=True,
    )
    assert typed.stdout.strip() == "True"
