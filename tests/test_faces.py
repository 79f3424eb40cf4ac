"""webdataset's module map in wdsx: every public module importable under its own name, each
exposing the names webdataset defines there, or raising UnsupportedError that says what to use."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import types

import pytest
import webdataset

import wdsx
from wdsx.errors import UnsupportedError

FACES = (
    "autodecode cache compat extradatasets filters gopen handlers pipeline pytorch "
    "shardlists tariterators tenbin utils writer"
).split()
"""webdataset 1.0.2's public modules but ``mix`` (its RandomMix/RoundRobin are being built)."""

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def defined_names(module: types.ModuleType) -> list[str]:
    """The public names a webdataset module defines itself (not the ones it imports)."""
    names = []
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        if getattr(value, "__module__", module.__name__) == module.__name__ or not hasattr(
            value, "__module__"
        ):
            names.append(name)
    return names


@pytest.mark.parametrize("name", FACES)
def test_face_exposes_or_explains_every_name(name):
    theirs = importlib.import_module(f"webdataset.{name}")
    face = importlib.import_module(f"wdsx.{name}")
    absent = getattr(face, "ABSENT", {})
    for attribute in defined_names(theirs):
        if attribute == "PIPE":  # subprocess.PIPE, an int that carries no module
            continue
        if attribute in absent:
            with pytest.raises(UnsupportedError, match=f"{name}.{attribute} has no counterpart in wdsx"):
                getattr(face, attribute)
        else:
            assert getattr(face, attribute) is not None, attribute
    for attribute in face.__all__:
        assert getattr(face, attribute) is not None


@pytest.mark.parametrize("name", FACES)
def test_both_spellings_reach_the_face(name):
    face = importlib.import_module(f"wdsx.{name}")
    namespace: dict = {}
    exec(f"from wdsx import {name} as reached", namespace)
    if name == "gopen":  # as in webdataset, the package attribute is the function
        assert namespace["reached"] is wdsx.gopen is face.gopen
    else:
        assert namespace["reached"] is face is getattr(wdsx, name)


def test_unsupported_names_explain_themselves():
    with pytest.raises(UnsupportedError, match="wdsx.sources.register"):
        exec("from wdsx.gopen import gopen_schemes", {})
    with pytest.raises(UnsupportedError, match="cache_dir"):
        wdsx.cache.FileCache  # noqa: B018
    with pytest.raises(UnsupportedError, match="WDS_PYTORCH_WEIGHTS_ONLY"):
        wdsx.pytorch_weights_only  # noqa: B018
    with pytest.raises(AttributeError):
        wdsx.shardlists.no_such_name  # noqa: B018
    assert not hasattr(wdsx, "no_such_name")


def test_top_level_names_match_webdataset():
    """Every name ``webdataset`` exports exists in ``wdsx`` or raises UnsupportedError."""
    for name in dir(webdataset):
        if name.startswith("_") or name in ("mix", "RandomMix", "RoundRobin"):
            continue
        try:
            getattr(wdsx, name)  # an AttributeError fails the test
        except UnsupportedError:
            continue


def test_every_unsupported_name_is_in_the_readme():
    with open(os.path.join(ROOT, "README.md")) as stream:
        readme = stream.read()
    section = readme[readme.index("## Migrating from webdataset") :]
    for name in FACES:
        for attribute in getattr(importlib.import_module(f"wdsx.{name}"), "ABSENT", {}):
            assert f"`{name}.{attribute}`" in section or f"`{attribute}`" in section, f"{name}.{attribute}"


def test_import_stays_light():
    """``import wdsx`` and every face import neither torch nor webdataset; torch comes in
    only when a torch name of ``wdsx.pytorch`` is used."""
    faces = ", ".join(f"wdsx.{name}" for name in FACES)
    code = (
        f"import sys, wdsx, {faces}\n"
        "assert 'torch' not in sys.modules and 'webdataset' not in sys.modules, sorted(sys.modules)\n"
        "wdsx.pytorch.IterableDataset\n"
        "assert 'torch' in sys.modules and 'webdataset' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_lmdb_cache_pickles_and_replays(tmp_path):
    """The LMDB stage opens its database lazily, so it pickles (into DataLoader workers) even
    after use, and a pickled copy replays the stored pass."""
    path = str(tmp_path / "cache")
    dataset = wdsx.DataPipeline(list(range(7)), wdsx.LMDBCached(path, chunksize=3))
    assert list(dataset) == list(range(7))
    copy = pickle.loads(pickle.dumps(dataset))
    assert list(copy) == list(range(7))
    assert copy.pipeline[1].complete_count() == 7


def test_caches_store_only_complete_passes():
    source = wdsx.DataPipeline(list(range(5)), wdsx.Cached())
    first = iter(source)
    assert [next(first), next(first)] == [0, 1]
    assert source.pipeline[1].cached is None
    assert list(source) == list(range(5)) and source.pipeline[1].cached == list(range(5))
