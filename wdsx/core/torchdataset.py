"""wdsx's datasets as torch ``IterableDataset``\\ s, without wdsx importing torch.

webdataset's pipelines and shard lists subclass torch's ``IterableDataset``, so torch's
``DataLoader`` iterates them instead of indexing them, and ``a + b`` chains two of them. wdsx
does not import torch (a command that writes shards, or a worker that only reads, does not pay
for it), so its classes are registered with ``IterableDataset`` instead (it is an abstract base
class): at once where the program has already imported torch, else the moment it imports
``torch.utils.data``, through an import hook that leaves once it has registered them. A
dataset built before the program
imports torch is then an ``IterableDataset`` too.

What registration cannot give: ``isinstance(dataset, torch.utils.data.Dataset)`` stays False
(``Dataset`` is not an abstract base class), as the documentation's differences page says.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypeVar

T = TypeVar("T", bound=type)

_MODULES = ("torch.utils.data", "torch.utils.data.dataset")
"""The package that exports ``IterableDataset``, and the module that defines it."""
_classes: list[type] = []
_lock = threading.Lock()


def iterable_dataset(cls: T) -> T:
    """Class decorator: make ``cls`` (and its subclasses) a torch ``IterableDataset`` as soon
    as torch is loaded."""
    with _lock:
        _classes.append(cls)
        if not _register([cls]) and not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterOnImport())
    return cls


def _register(classes: Sequence[type]) -> bool:
    """Register ``classes`` with torch's ``IterableDataset``; False where it is not defined yet.
    It is looked up in the module that defines it too: while another thread imports
    ``torch.utils.data``, that package is already in ``sys.modules`` without its names."""
    for module in _MODULES:
        iterable = getattr(sys.modules.get(module), "IterableDataset", None)
        if iterable is not None:
            for cls in classes:
                iterable.register(cls)
            return True
    return False


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch.utils.data`` or the module that defines
    ``IterableDataset`` is being imported (the second also catches an import of the first
    that another thread had begun), it takes the spec the other finders give and wraps its
    loader, so that every decorated class is registered right after the module runs. It
    leaves ``sys.meta_path`` once registration has succeeded (an import that fails, a broken
    torch install, leaves it waiting for the next)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MODULES:
            return None
        for finder in [finder for finder in sys.meta_path if finder is not self]:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader, self)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """The module's own loader, with the registration run once the module has executed."""

    def __init__(self, loader: Any, finder: _RegisterOnImport):
        self.loader = loader
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        with _lock:
            if _register(_classes) and self.finder in sys.meta_path:
                sys.meta_path.remove(self.finder)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
