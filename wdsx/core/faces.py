"""Support for wdsx's webdataset-named face modules (``wdsx.shardlists``, ``wdsx.cache``...).

A face module re-exports wdsx's implementation under webdataset's module name. The webdataset
names wdsx leaves out on purpose are listed with what to use instead; :func:`absent_names`
builds the module's ``__getattr__``, which raises :class:`~wdsx.errors.UnsupportedError`
with that advice, so ``from wdsx.cache import FileCache`` says why and what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NoReturn

from wdsx.core.errors import UnsupportedError


def absent_names(module: str, advice: Mapping[str, str]) -> Callable[[str], NoReturn]:
    """A module ``__getattr__`` for ``module``: names in ``advice`` raise UnsupportedError
    carrying the advice; other unknown names raise AttributeError as usual."""

    original = "webdataset" + module.removeprefix("wdsx")

    def __getattr__(name: str) -> NoReturn:
        if name in advice:
            raise UnsupportedError(f"{original}.{name} has no counterpart in wdsx: {advice[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
