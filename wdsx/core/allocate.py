"""Where batch arrays are allocated.

A stage that builds a batch (``batched``'s collation, decoding straight into a batch) asks
:func:`empty` for its output array. In a plain process that is ``numpy.empty``. Inside a
WebLoader worker the loader installs an allocator that places large arrays in the shared
memory the batch will travel to the main process in, so the batch is written once and never
copied for the trip (:mod:`wdsx.loader.arena`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Allocator = Callable[[tuple[int, ...], Any], np.ndarray]

_installed: list[Allocator] = []


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array for a batch, from the installed allocator if there is one."""
    if _installed:
        return _installed[0](shape, dtype)
    return np.empty(shape, dtype)


def shared() -> bool:
    """True when an allocator other than ``numpy.empty`` is installed (batches built with
    :func:`empty` then skip a copy on their way out of the process)."""
    return bool(_installed)


def install(allocator: Allocator | None) -> None:
    """Make ``allocator`` this process's batch allocator (None: back to ``numpy.empty``)."""
    _installed[:] = [] if allocator is None else [allocator]
