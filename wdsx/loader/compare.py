"""Exact comparison of what pipelines yield: numbers, arrays, tensors, images, and containers of
them, bit for bit, with a short description of the first difference.

Used by the resume checker (:mod:`wdsx.loader.check`), which needs to say *what* differs (which
element of a batch, which row) and not only that something does. torch is never imported here
unless the values are torch tensors already.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def difference(a: Any, b: Any, where: str = "") -> str | None:
    """None when ``a`` and ``b`` are identical (same types, shapes, dtypes and bits; NaNs
    equal themselves), else a description of the first difference, prefixed by ``where``."""
    if _is_tensor(a) or _is_tensor(b):
        return _tensors(a, b, where)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _arrays(a, b, where)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            return f"{where or 'item'}: fields {list(a)} vs {list(b)}"
        for key in a:
            found = difference(a[key], b[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{where or 'item'}: {type(a).__name__} of {len(a)} vs {type(b).__name__} of {len(b)}"
        for index, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f"{where}[{index}]")
            if found:
                return found
        return None
    if _is_image(a) or _is_image(b):
        same = (
            _is_image(a) and _is_image(b) and (a.mode, a.size, a.tobytes()) == (b.mode, b.size, b.tobytes())
        )
        return None if same else f"{where or 'item'}: images differ"
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    if type(a) is not type(b) or a != b:
        return f"{where or 'item'}: {_short(a)} vs {_short(b)}"
    return None


def rows(batch: Any, size: int) -> list[Any] | None:
    """The ``size`` rows of a batch: a dict, tuple or list of columns (what ``batched``
    makes), or else a list of ``size`` items (``listed``); None when it is neither."""
    if isinstance(batch, Mapping):
        if all(_length(column) == size for column in batch.values()):
            return [{key: batch[key][i] for key in batch} for i in range(size)]
        return None
    if isinstance(batch, (tuple, list)) and batch and all(_length(column) == size for column in batch):
        return [tuple(column[i] for column in batch) for i in range(size)]
    if isinstance(batch, list) and len(batch) == size:
        return list(batch)
    return None


def _length(column: Any) -> int | None:
    if isinstance(column, (str, bytes)) or not hasattr(column, "__getitem__"):
        return None
    try:
        return len(column)
    except TypeError:
        return None


def _is_image(value: Any) -> bool:
    """A PIL image, recognised without importing PIL."""
    return hasattr(value, "tobytes") and hasattr(value, "mode") and hasattr(value, "size")


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "shape")


def _tensors(a: Any, b: Any, where: str) -> str | None:
    if not (_is_tensor(a) and _is_tensor(b)):
        return f"{where or 'item'}: {type(a).__name__} vs {type(b).__name__}"
    import torch

    if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
        return f"{where or 'item'}: tensor {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    same = torch.equal(a, b)
    if not same and a.is_floating_point():
        nan = a.isnan()
        same = torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
    return None if same else f"{where or 'item'}: tensor values differ"


def _arrays(a: Any, b: Any, where: str) -> str | None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return f"{where or 'item'}: {type(a).__name__} vs {type(b).__name__}"
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        return f"{where or 'item'}: array {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    same = np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return None if same else f"{where or 'item'}: array values differ"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
