"""webdataset's module map in wdsx: every public module importable under its own name, each
name webdataset defines there resolving to a working object; the few names left out raise an
AttributeError that says what to use, so ``hasattr`` and ``ImportError`` fallbacks work."""

from __future__ import annotations

import ast
import importlib
import os
import pickle
import pkgutil
import subprocess
import sys
import types

import pytest
import webdataset

import wdsx
from wdsx.core.errors import AbsentNameError
from wdsx.core.faces import absent_names
from wdsx.errors import UnsupportedError

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
COVERAGE_FLOOR = 0.98

MODULES = sorted(
    info.name for info in pkgutil.iter_modules(webdataset.__path__) if not info.name.startswith("_")
)
"""The installed webdataset's public modules."""
OLD_MODULES = ["cborsiterators"]
"""Public modules of webdataset 0.2.x that 1.0 dropped and programs pinned to 0.2 import."""


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


def source_names(name: str) -> list[str]:
    """The public top-level names of ``webdataset.<name>``'s source, for a module that cannot
    be imported here (``multi`` needs ZMQ)."""
    spec = importlib.util.find_spec(f"webdataset.{name}")
    assert spec is not None and spec.origin is not None
    with open(spec.origin) as stream:
        tree = ast.parse(stream.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return sorted(name for name in names if not name.startswith("_"))


def module_map() -> list[tuple[str | None, str | None]]:
    """webdataset's public modules ``(module, None)``, the names each defines ``(module,
    name)``, and the package's own names ``(None, name)``."""
    entries: list[tuple[str | None, str | None]] = []
    for name in MODULES:
        entries.append((name, None))
        try:
            names = defined_names(importlib.import_module(f"webdataset.{name}"))
        except ImportError:
            names = source_names(name)
        entries += [(name, attribute) for attribute in names]
    for attribute in dir(webdataset):
        if not attribute.startswith("_") and not isinstance(getattr(webdataset, attribute), types.ModuleType):
            entries.append((None, attribute))
    return entries


def resolve(module: str | None, name: str | None) -> object:
    """wdsx's object for a module-map entry; raises if there is none."""
    if module is None:
        return getattr(wdsx, name or "")
    face = importlib.import_module(f"wdsx.{module}")
    return face if name is None else getattr(face, name)


def label(module: str | None, name: str | None) -> str:
    return ".".join(part for part in ("webdataset", module, name) if part)


def test_module_map_coverage():
    """At least 98% of webdataset 1.0.2's public modules and names are working objects."""
    entries = module_map()
    missing = []
    for module, name in entries:
        try:
            resolve(module, name)
        except (AttributeError, ImportError):
            missing.append(label(module, name))
    resolved = len(entries) - len(missing)
    coverage = resolved / len(entries)
    message = f"module map: {resolved} of {len(entries)} resolve ({coverage:.1%}); missing: {missing}"
    print(message)
    assert coverage >= COVERAGE_FLOOR, message


def test_hasattr_never_raises():
    for module, name in module_map():
        if name is None:
            continue
        owner = wdsx if module is None else importlib.import_module(f"wdsx.{module}")
        assert hasattr(owner, name) in (True, False), label(module, name)


def faces_with_absent_names() -> list[tuple[str, str, str]]:
    """``(module, name, advice)`` for every name a face still leaves out."""
    found = []
    for module in [*MODULES, *OLD_MODULES]:
        try:
            face = importlib.import_module(f"wdsx.{module}")
        except ImportError:
            continue
        found += [(module, name, advice) for name, advice in getattr(face, "ABSENT", {}).items()]
    return found


def test_refused_names_are_attribute_errors_with_advice():
    for module, name, advice in faces_with_absent_names():
        face = importlib.import_module(f"wdsx.{module}")
        assert not hasattr(face, name)
        assert getattr(face, name, None) is None
        with pytest.raises(AbsentNameError, match="has no counterpart in wdsx") as caught:
            getattr(face, name)
        assert advice in str(caught.value)
        with pytest.raises(ImportError):
            exec(f"from wdsx.{module} import {name}", {})


def test_refusal_is_attribute_and_unsupported_error(monkeypatch):
    """The mechanism itself, on a module made for the test: hasattr, getattr's default and
    ``from ... import`` fallbacks all see a missing name; the advice is in the message."""
    module = types.ModuleType("wdsx.refusing")
    module.__getattr__ = absent_names("wdsx.refusing", {"gone": "use kept instead"})  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "wdsx.refusing", module)
    assert not hasattr(module, "gone") and getattr(module, "gone", 7) == 7
    with pytest.raises(
        UnsupportedError, match=r"webdataset\.refusing\.gone has no counterpart in wdsx: use kept"
    ):
        module.gone  # noqa: B018
    with pytest.raises(AttributeError):
        module.gone  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'other'"):
        module.other  # noqa: B018
    namespace: dict = {}
    exec("try:\n    from wdsx.refusing import gone\nexcept ImportError:\n    gone = 'fallback'", namespace)
    assert namespace["gone"] == "fallback"


@pytest.mark.parametrize("name", [*MODULES, *OLD_MODULES])
def test_both_spellings_reach_the_face(name):
    face = importlib.import_module(f"wdsx.{name}")
    namespace: dict = {}
    exec(f"from wdsx import {name} as reached", namespace)
    if name == "gopen":  # as in webdataset, the package attribute is the function
        assert namespace["reached"] is wdsx.gopen is face.gopen
    else:
        assert namespace["reached"] is face
    for attribute in getattr(face, "__all__", []):
        assert getattr(face, attribute) is not None, f"{name}.{attribute}"


OLD_TOP_LEVEL = (
    "cached_tarfile_samples cached_tarfile_to_samples lru_cleanup maybe_cached_tarfile_to_samples "
    "cbors_to_samples cbors2_to_samples"
).split()
"""Names webdataset 0.2.86's package exported that 1.0 dropped."""
OLD_CACHE = "cached_url_opener get_file_cached".split()


def test_webdataset_0_2_names_resolve():
    for name in OLD_TOP_LEVEL:
        assert callable(getattr(wdsx, name)), name
    for name in OLD_CACHE:
        assert callable(getattr(wdsx.cache, name)), name


def test_every_unsupported_name_is_in_the_readme():
    with open(os.path.join(ROOT, "README.md")) as stream:
        readme = stream.read()
    section = readme[readme.index("## Migrating from webdataset") :]
    for module, name, _ in faces_with_absent_names():
        assert f"`{module}.{name}`" in section or f"`{name}`" in section, f"{module}.{name}"


@pytest.mark.slow
def test_import_stays_light():
    """``import wdsx`` and every face import neither torch, webdataset nor PyYAML; torch comes
    in only when a torch name of ``wdsx.pytorch`` is used."""
    faces = ", ".join(f"wdsx.{name}" for name in [*MODULES, *OLD_MODULES])
    code = (
        f"import sys, wdsx, {faces}\n"
        "heavy = [name for name in ('torch', 'webdataset', 'yaml') if name in sys.modules]\n"
        "assert not heavy, heavy\n"
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
