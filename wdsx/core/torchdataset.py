"""wdsx's datasets as torch ``IterableDataset``\\ s, without wdsx importing torch.

webdataset's pipelines and shard lists subclass torch's ``IterableDataset``, so torch's
``DataLoader`` iterates them instead of indexing them, and ``a + b`` chains two of them. wdsx
does not import torch (a command that writes shards, or a worker that only reads, does not pay
for it), so its classes are registered with ``IterableDataset`` instead (it is an abstract base
class): at once where the program has already imported torch, else the moment it imports
``torch.utils.data``, through a one-shot import hook. A dataset built before the program
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

_TORCH_DATA = "torch.utils.data"
_classes: list[type] = []
_lock = threading.Lock()


def iterable_dataset(cls: T) -> T:
    """Class decorator: make ``cls`` (and its subclasses) a torch ``IterableDataset`` as soon
    as torch is loaded."""
    with _lock:
        _classes.append(cls)
        if _TORCH_DATA in sys.modules:
            _register([cls])
        elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _RegisterOnImport())
    return cls


def _register(classes: Sequence[type]) -> None:
    data = sys.modules.get(_TORCH_DATA)
    iterable = getattr(data, "IterableDataset", None)
    if iterable is not None:
        for cls in classes:
            iterable.register(cls)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``torch.utils.data`` is being imported, it takes the spec
    the other finders give and wraps its loader, so that every decorated class is registered
    right after the module runs. It then leaves ``sys.meta_path``."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TORCH_DATA:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RegisteringLoader(spec.loader)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """The module's own loader, with the registration run once the module has executed."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        self.loader.exec_module(module)
        with _lock:
            _register(_classes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)
