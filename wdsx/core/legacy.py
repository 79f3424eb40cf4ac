"""webdataset's general helpers that programs import from ``webdataset.utils``.

wdsx's engine uses none of them; they are here so that those imports work, with webdataset's
behaviour. ``safe_eval`` and ``lookup_sym`` evaluate or import what the caller passes: wdsx
never calls them on anything read from a shard.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def safe_eval(s: str, expr: str = "{}") -> Any:
    """Evaluate ``expr`` with ``s`` put in place of ``{}``; ``s`` may hold only letters,
    digits and underscores (a name or a number), so it cannot add code of its own."""
    if re.sub("[^A-Za-z0-9_]", "", s) != s:
        raise ValueError(f"safe_eval: illegal characters in: '{s}'")
    return eval(expr.format(s))  # noqa: S307 - the caller's own expression, see the docstring


def lookup_sym(sym: str, modules: Sequence[str]) -> Any:
    """The first attribute ``sym`` (not None) of the named modules, imported in order
    (relative names such as ``".filters"`` are inside wdsx); None if none has it."""
    for name in modules:
        found = getattr(importlib.import_module(name, package="wdsx"), sym, None)
        if found is not None:
            return found
    return None


def deprecated(arg: Any = None) -> Any:
    """Decorator: calling the function warns with a DeprecationWarning. Use it bare
    (``@deprecated``) or with a reason (``@deprecated("use g")``)."""

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        def warned(*args: Any, **kwargs: Any) -> Any:
            message = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                message += " Reason: " + reason
            warnings.warn(message, category=DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return warned

    if callable(arg):
        reason = None
        return decorate(arg)
    reason = arg
    return decorate


class ObsoleteException(Exception):
    """Raised by a function marked :func:`obsolete` unless ``ALLOW_OBSOLETE=1``."""


def obsolete(func: Callable | None = None, *, reason: str | None = None) -> Any:
    """Decorator: calling the function raises ObsoleteException unless the environment has
    ``ALLOW_OBSOLETE=1``."""
    if func is None:
        return functools.partial(obsolete, reason=reason)

    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if not int(os.environ.get("ALLOW_OBSOLETE", "0")):
            message = f"Call to obsolete function {func.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                message += " Reason: " + reason
            raise ObsoleteException(message)
        return func(*args, **kwargs)

    return guarded


def compute_sample_weights(n_w_pairs: Sequence[tuple[float, float]]) -> np.ndarray:
    """Per-dataset sampling weights from ``(size, weight)`` pairs: ``size * weight``, scaled
    so the largest is 1."""
    sizes = np.array([pair[0] for pair in n_w_pairs])
    weights = np.array([pair[1] for pair in n_w_pairs])
    weighted = sizes * weights
    return weighted / np.amax(weighted)
