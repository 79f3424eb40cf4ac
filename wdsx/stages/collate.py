"""webdataset's batch collation: how ``batched`` turns a list of items into a batch.

Per field, ints and floats become a numpy array, numpy arrays are stacked with numpy, torch
tensors with torch, anything else becomes a list. Inside a WebLoader worker, stacked arrays
are built in the shared memory the batch travels in (:mod:`wdsx.core.allocate`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from wdsx.core import allocate


def _is_tensor(value: Any) -> bool:
    if "torch" not in sys.modules:
        return False
    import torch

    return isinstance(value, torch.Tensor)


def combine_column(values: list, combine_tensors: bool, combine_scalars: bool) -> Any:
    """One field of a batch from its values, one per item."""
    first = values[0]
    if isinstance(first, (int, float)):
        return np.array(values) if combine_scalars else values
    if isinstance(first, np.ndarray):
        if not combine_tensors:
            return values
        _check_shapes(values)
        return _stack_arrays(values)
    if _is_tensor(first):
        if not combine_tensors:
            return values
        _check_shapes(values)
        return _stack_tensors(values)
    return values


def _stack_arrays(values: list[np.ndarray]) -> np.ndarray:
    """``np.array(values)``; inside a WebLoader worker, built in the shared memory the batch
    travels in (:mod:`wdsx.core.allocate`), which saves copying it there afterwards."""
    dtype = values[0].dtype
    if (
        not allocate.shared()
        or not dtype.isnative
        or dtype.hasobject
        or any(value.dtype != dtype for value in values)
    ):
        return np.array(values)
    return np.stack(values, out=allocate.empty((len(values), *values[0].shape), dtype))


def _stack_tensors(values: list) -> Any:
    """``torch.stack(values)``, built like :func:`_stack_arrays` where it can be."""
    import torch

    first = values[0]
    if not allocate.shared() or any(
        value.dtype != first.dtype
        or value.device.type != "cpu"
        or value.requires_grad
        or (value.dim() > 3 and not value.is_contiguous())  # torch.stack keeps channels-last layouts
        for value in values
    ):
        return torch.stack(values)
    try:
        dtype = torch.empty(0, dtype=first.dtype).numpy().dtype
    except TypeError:  # a torch type numpy lacks (bfloat16...)
        return torch.stack(values)
    return torch.stack(values, out=torch.from_numpy(allocate.empty((len(values), *first.shape), dtype)))


def _check_shapes(values: list) -> None:
    shapes = {tuple(value.shape) for value in values}
    if len(shapes) > 1:
        raise ValueError(f"cannot stack values of different shapes {sorted(shapes)} into a batch")


def default_collation_fn(
    samples: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True
) -> Any:
    """Collate tuples (into a tuple of columns) or dicts (into a dict of columns)."""
    first = samples[0]
    if isinstance(first, dict):
        keys = set(first)
        for sample in samples[1:]:
            if set(sample) != keys:
                raise ValueError(
                    f"samples in a batch have different fields: {sorted(keys)} vs {sorted(sample)}"
                )
        return {
            key: combine_column([sample[key] for sample in samples], combine_tensors, combine_scalars)
            for key in first
        }
    if isinstance(first, (tuple, list)) and any(len(sample) != len(first) for sample in samples):
        lengths = sorted({len(sample) for sample in samples})
        raise ValueError(f"samples in a batch have different numbers of fields: {lengths}")
    columns = zip(*samples)
    return tuple(combine_column(list(column), combine_tensors, combine_scalars) for column in columns)


def collate_torch(samples: Sequence[Any]) -> Any:
    """Collate into torch tensors with torch's ``default_collate`` (numbers and arrays too)."""
    from torch.utils.data import default_collate

    return default_collate(list(samples))
