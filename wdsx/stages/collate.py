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


def plain_array(value: Any) -> np.ndarray | None:
    """The array whose copy stands for ``value`` in a stacked batch: itself for a plain numpy
    array, its numpy view for a CPU tensor without grad. None for anything else, and for values
    whose stack is not a plain copy of each (``np.array`` turns a non-native byte order native;
    ``torch.stack`` keeps a channels-last layout, which 4-D and 5-D tensors that are not
    contiguous may have)."""
    if type(value) is np.ndarray:
        return value if value.dtype.isnative and not value.dtype.hasobject else None
    if "torch" not in sys.modules:
        return None
    import torch

    if type(value) is not torch.Tensor or value.requires_grad or value.device.type != "cpu":
        return None
    if value.dim() > 3 and not value.is_contiguous():
        return None
    try:
        return value.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks, a sparse tensor, a conjugate view...
        return None


def _stacked_in_batch_memory(values: list) -> np.ndarray | None:
    """Inside a WebLoader worker, same-typed values stacked straight into the shared memory the
    batch travels in (:mod:`wdsx.core.allocate`), which saves copying it there afterwards;
    None elsewhere, and where the stack is not a plain copy of each value (:func:`plain_array`)."""
    if not allocate.shared():
        return None
    kind = type(values[0])
    arrays: list[np.ndarray] = []
    for value in values:
        array = plain_array(value) if type(value) is kind else None
        if array is None or array.dtype != (arrays[0] if arrays else array).dtype:
            return None
        arrays.append(array)
    return np.stack(arrays, out=allocate.empty((len(arrays), *arrays[0].shape), arrays[0].dtype))


def _stack_arrays(values: list[np.ndarray]) -> np.ndarray:
    """``np.array(values)``, in batch memory where it can be."""
    stacked = _stacked_in_batch_memory(values)
    return np.array(values) if stacked is None else stacked


def _stack_tensors(values: list) -> Any:
    """``torch.stack(values)``, in batch memory where it can be."""
    import torch

    stacked = _stacked_in_batch_memory(values)
    return torch.stack(values) if stacked is None else torch.from_numpy(stacked)


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
