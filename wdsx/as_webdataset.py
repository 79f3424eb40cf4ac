"""Run unchanged code written for webdataset on wdsx.

Code you write yourself can say ``import wdsx as wds``. Code you cannot edit (a training
package from PyPI, a colleague's script) says ``import webdataset``; this module makes that
import give wdsx:

- :func:`install` adds an import hook: from then on ``import webdataset`` is ``wdsx`` itself
  and ``import webdataset.<module>`` is wdsx's face module ``wdsx.<module>``, for every module
  name that webdataset 0.2.x and 1.0.x have (``filters``, ``tariterators``, ``shardlists``,
  ``gopen``, ``cache``, ...). A webdataset module wdsx has no face for raises
  ``ModuleNotFoundError``, so ``try: import ... except ImportError:`` fallbacks work.
- ``python -m wdsx.as_webdataset script.py args...`` and
  ``python -m wdsx.as_webdataset -m package.module args...`` install the hook, then run the
  program as ``python script.py args...`` / ``python -m package.module args...`` would (the
  same ``sys.argv``, ``sys.path[0]`` and ``__main__``). It also runs under
  ``torchrun -m wdsx.as_webdataset ...``.

The hook reaches every worker process: a forked worker inherits it, and a worker started by
the ``spawn`` or ``forkserver`` method (DataLoader's ``multiprocessing_context``,
``torch.multiprocessing.spawn``) installs it before it re-imports the parent's ``__main__``
or unpickles anything, because the hook travels in the start-up data multiprocessing sends
every such child. No ``.pth`` file, ``sitecustomize`` or environment variable is involved.

Importing this module imports neither torch nor webdataset.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import multiprocessing.spawn
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# Every module name of webdataset 0.2.86, the last 0.2.x (0.2.111) and 1.0.x.
WEBDATASET_MODULES = frozenset(
    {
        "autodecode",
        "bench",
        "cache",
        "cborsiterators",
        "compat",
        "downloader",
        "extradatasets",
        "filters",
        "gopen",
        "handlers",
        "mix",
        "multi",
        "pipeline",
        "pytorch",
        "shardlists",
        "tariterators",
        "tenbin",
        "typecheck",
        "utils",
        "writer",
    }
)

_ALIAS = "webdataset"
_TARGET = "wdsx"
# The key under which the hook rides in the start-up data of spawned and forkserver children.
_SPAWN_KEY = "wdsx.as_webdataset"

USAGE = """\
usage: python -m wdsx.as_webdataset script.py [args...]
       python -m wdsx.as_webdataset -m module [args...]

Runs the program as python would, with `import webdataset` resolving to wdsx."""


def install() -> None:
    """Make ``import webdataset`` and ``import webdataset.<module>`` give wdsx from now on,
    in this process and in the worker processes it starts.

    Calling it again does nothing. It must run before the program's first
    ``import webdataset``: a webdataset already imported cannot be swapped, so that raises
    ImportError naming where it was imported from.
    """
    already = sys.modules.get(_ALIAS)
    if already is not None and already is not sys.modules.get(_TARGET):
        where = getattr(already, "__file__", None) or repr(already)
        raise ImportError(
            f"webdataset is already imported (from {where}); call wdsx.as_webdataset.install() "
            "before the program's first `import webdataset`, or run it with "
            "`python -m wdsx.as_webdataset`",
            name=_ALIAS,
        )
    if not is_installed():
        sys.meta_path.insert(0, _FINDER)
    if not isinstance(multiprocessing.spawn.get_preparation_data, _PreparationWithHook):
        multiprocessing.spawn.get_preparation_data = _PreparationWithHook(
            multiprocessing.spawn.get_preparation_data
        )


def is_installed() -> bool:
    """Whether :func:`install` has run in this process (or in the parent that spawned it)."""
    return _FINDER in sys.meta_path


class _WebdatasetFinder(importlib.abc.MetaPathFinder):
    """Answers for ``webdataset`` and ``webdataset.*`` before any other finder, so the real
    webdataset, installed or not, is never found."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == _ALIAS:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(_TARGET), is_package=True)
        if not fullname.startswith(_ALIAS + "."):
            return None
        module = fullname.removeprefix(_ALIAS + ".")
        target_name = f"{_TARGET}.{module}"
        if module not in WEBDATASET_MODULES or importlib.util.find_spec(target_name) is None:
            # Answering None would let the path finder load wdsx's internals a second time
            # under webdataset's name, so a name wdsx has no face for is refused here.
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: wdsx has no counterpart of webdataset's {module!r} module",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(target_name))


class _AliasLoader(importlib.abc.Loader):
    """Loads an alias as the wdsx module itself (the same object, not a copy)."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set the alias's spec on the wdsx module; give it back
        # its own, so pickling, reloading and `python -m` still see the real module.
        module.__spec__ = self._own_spec
        if self._target == _TARGET:
            _alias_loaded_faces()


def _alias_loaded_faces() -> None:
    """Register the face modules ``import wdsx`` has already loaded under webdataset's names.

    When the import system loads a submodule for the first time it also binds it on its
    parent, which here is wdsx itself: a first ``import webdataset.gopen`` would replace the
    function ``wdsx.gopen`` by its module. Registering the loaded faces up front means those
    imports find them in ``sys.modules`` and bind nothing.
    """
    for module in WEBDATASET_MODULES:
        face = sys.modules.get(f"{_TARGET}.{module}")
        if face is not None:
            sys.modules.setdefault(f"{_ALIAS}.{module}", face)


class _InstallInChild:
    """Pickles as a call to :func:`install`: unpickled first thing in a spawned child."""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return install, ()


class _PreparationWithHook:
    """multiprocessing's ``get_preparation_data`` plus the hook.

    A spawned or forkserver child unpickles this start-up data before it re-imports the
    parent's ``__main__`` and before it unpickles the process object, so the hook is in place
    before any of the program's modules runs ``import webdataset``. The child's ``prepare``
    reads only the keys it knows and ignores this one.
    """

    def __init__(self, original: Callable[[str], dict[str, Any]]) -> None:
        self._original = original

    def __call__(self, name: str) -> dict[str, Any]:
        data = self._original(name)
        data[_SPAWN_KEY] = _InstallInChild()
        return data


_FINDER = _WebdatasetFinder()


def main(argv: Sequence[str] | None = None) -> None:
    """The runner: ``python -m wdsx.as_webdataset [-m module | script.py] args...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return
    if not args or args == ["-m"]:
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    install()
    if args[0] == "-m":
        # run_module puts the module's own path in sys.argv[0], as `python -m` does.
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = args[0]
    sys.argv = [script, *args[1:]]
    if not sys.flags.safe_path:
        # `python script.py` puts the script's folder first on sys.path where `python -m`
        # put the current folder (and, under -P, neither).
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    # Run through the module's importable name, so the hook and the spawn start-up data
    # refer to `wdsx.as_webdataset` and not to this `__main__`.
    from wdsx.as_webdataset import main as _main

    _main()
