"""Support for wdsx's webdataset-named face modules (``wdsx.shardlists``, ``wdsx.cache``...).

A face module re-exports wdsx's implementation under webdataset's module name. Two things
need more than a re-export:

- names wdsx leaves out on purpose, listed with what to use instead: :func:`absent_names`
  builds the module's ``__getattr__``, which raises :class:`~wdsx.errors.AbsentNameError`
  (an ``AttributeError``) carrying that advice, so ``hasattr`` is False and
  ``try: from wdsx.x import name / except ImportError`` falls back as for any missing name;
- module-level switches that webdataset programs assign (``webdataset.utils.enforce_security
  = True``): :func:`live_settings` turns them into properties of the module backed by the
  environment variable wdsx reads, so an assignment takes effect (in DataLoader workers too)
  and a read says what wdsx does now.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from wdsx.core.errors import AbsentNameError


def absent_names(module: str, advice: Mapping[str, str]) -> Callable[[str], NoReturn]:
    """A module ``__getattr__`` for ``module``: names in ``advice`` raise AbsentNameError
    carrying the advice; other unknown names raise AttributeError as usual."""

    original = "webdataset" + module.removeprefix("wdsx")

    def __getattr__(name: str) -> NoReturn:
        if name in advice:
            raise AbsentNameError(f"{original}.{name} has no counterpart in wdsx: {advice[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


TORCH_NAMES = {
    "IterableDataset": ("torch.utils.data", "IterableDataset"),
    "DataLoader": ("torch.utils.data", "DataLoader"),
    "TorchTensor": ("torch", "Tensor"),
}
"""The torch names webdataset's modules import at their top (so programs import them from
there), and where torch has them."""
_stand_ins: dict[str, type] = {}


def torch_name(name: str) -> Any:
    """torch's object for one of :data:`TORCH_NAMES`, imported now; without torch, a stand-in
    class (the same one every time) that code can still subclass, as in webdataset."""
    import importlib

    module_name, attribute = TORCH_NAMES[name]
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except ModuleNotFoundError:
        doc = f"Stand-in for torch's {attribute} (torch is not installed)."
        return _stand_ins.setdefault(name, type(name, (), {"__doc__": doc}))


def torch_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module`` that gives :data:`TORCH_NAMES` on first use,
    so importing the module does not import torch."""

    def __getattr__(name: str) -> Any:
        if name not in TORCH_NAMES:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = torch_name(name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__


class Setting:
    """A module-level switch: ``read()`` gives its current value, ``write(value)`` sets it."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None], doc: str):
        self.read = read
        self.write = write
        self.doc = doc


def environment_setting(
    variable: str, read: Callable[[], Any], doc: str, encode: Callable[[Any], str] = str
) -> Setting:
    """A setting that reads with ``read()`` and is assigned by setting the environment
    variable ``variable`` to ``encode(value)`` (so DataLoader workers started later see it)."""

    def write(value: Any) -> None:
        os.environ[variable] = encode(value)

    return Setting(read, write, doc)


def flag(value: Any) -> str:
    """How a boolean switch is written into the environment: ``"1"`` or ``"0"``."""
    return "1" if value else "0"


def _as_property(setting: Setting) -> property:
    def get(_module: types.ModuleType) -> Any:
        return setting.read()

    def set_(_module: types.ModuleType, value: Any) -> None:
        setting.write(value)

    return property(get, set_, doc=setting.doc)


def live_settings(module: str, settings: Mapping[str, Setting]) -> None:
    """Make each of ``settings`` a live attribute of the (already imported) ``module``."""
    target = sys.modules[module]
    namespace = {name: _as_property(setting) for name, setting in settings.items()}
    target.__class__ = type(f"{type(target).__name__}WithSettings", (types.ModuleType,), namespace)
