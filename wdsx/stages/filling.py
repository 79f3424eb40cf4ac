"""A batch collated while its items arrive, for items that carry large arrays or tensors.

Collating held items (:func:`wdsx.stages.collate.default_collation_fn`) keeps a whole batch
of separate arrays alive until the batch is full (32 images of 3x224x224 floats: 19 MB), then
reads them all back, long out of the CPU's caches, to stack them. A :class:`Filling` copies
each large array or tensor into its slot of the batch's array as soon as the item arrives,
while it is still in cache, and keeps no reference to it, so the memory the next item's
transform allocates is the same, still-cached memory. On the tutorial pipeline
(``decode("pil")`` and a resize-and-normalise transform) that is about 0.35 ms less CPU per
sample.

The batch equals the one collating the held items gives, value for value and type for type,
and so do its errors. Values whose stack is not a plain copy of each (a non-native byte order,
a channels-last tensor) are held from the start. A value that does not fit its column's slots
(another type, shape or dtype, a tensor that needs grad) turns that column back into held
values, and an item of another structure turns the whole batch back into held items, collated
at the end as before. One difference: a value is copied when it arrives, so a stage that later overwrites
an array it has already passed on no longer changes the batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wdsx.core import allocate
from wdsx.stages.collate import combine_column, default_collation_fn, plain_array

SLOT_BYTES = 1 << 16
"""Smaller values are held and stacked at the end: for them copying item by item costs more
Python work than the caches save."""

BATCH_BYTES = 1 << 30
"""A batch is allocated whole when its first item arrives; a larger one (a ``batched(n)`` with
a huge ``n`` that collects a few items) is held and stacked at the end, as large as its items."""


def _slot_array(value: Any, size: int) -> np.ndarray | None:
    """:func:`~wdsx.stages.collate.plain_array` of a value worth a row in a batch of ``size``:
    of at least :data:`SLOT_BYTES`, in a batch of at most :data:`BATCH_BYTES`."""
    array = plain_array(value)
    if array is None or array.nbytes < SLOT_BYTES or array.nbytes * size > BATCH_BYTES:
        return None
    return array


class _Slots:
    """A column of same-shaped arrays or tensors, each written into its row of one array."""

    __slots__ = ("rows", "out", "shape", "dtype", "is_tensor")

    def __init__(self, head: Any, array: np.ndarray, size: int):
        """Slots for ``size`` values like ``head`` (whose :func:`plain_array` is ``array``)."""
        self.shape, self.dtype = array.shape, array.dtype
        self.is_tensor = type(head) is not np.ndarray
        if self.is_tensor and not allocate.shared():
            import torch

            self.out: Any = torch.empty((size, *array.shape), dtype=head.dtype)
            self.rows = self.out.numpy()
        else:
            self.rows = allocate.empty((size, *array.shape), array.dtype)
            self.out = self.rows
            if self.is_tensor:
                import torch

                self.out = torch.from_numpy(self.rows)

    def put(self, index: int, value: Any) -> bool:
        """Copy ``value`` into row ``index``; False (nothing copied) if it does not fit."""
        if (type(value) is not np.ndarray) != self.is_tensor:
            return False
        array = plain_array(value)
        if array is None or array.shape != self.shape or array.dtype != self.dtype:
            return False
        self.rows[index] = array
        return True

    def values(self, count: int) -> list:
        """The first ``count`` values, as the items held them (views of their rows)."""
        return [self.out[index] for index in range(count)]

    def result(self, count: int) -> Any:
        """The column of a batch of ``count`` items: the array, or a copy of its first rows."""
        if count == len(self.rows):
            return self.out
        return self.out[:count].clone() if self.is_tensor else self.rows[:count].copy()


class Filling:
    """One batch of items of the first item's structure (a tuple, or a dict with ``keys``),
    collated while the items are added into ``columns``: slots, or values held."""

    def __init__(self, keys: tuple | None, length: int, columns: list[_Slots | list]):
        self.count = 0
        self.keys, self.length, self.columns = keys, length, columns
        self.items: list | None = None
        """The items, once one of another structure came: then collated at the end as held."""

    @classmethod
    def start(cls, first: Any, size: int) -> Filling | None:
        """A filling for a batch of ``size`` items like ``first``; None where that gains
        nothing (``first`` is not a tuple or dict, or holds no large array or tensor)."""
        if type(first) is dict:
            keys: tuple | None = tuple(first)
            values: Any = first.values()
        elif type(first) is tuple:
            keys, values = None, first
        else:
            return None
        arrays = [_slot_array(value, size) for value in values]
        if all(array is None for array in arrays):
            return None
        columns: list[_Slots | list] = [
            [] if array is None else _Slots(value, array, size) for value, array in zip(values, arrays)
        ]
        return cls(keys, len(first), columns)

    def add(self, item: Any) -> None:
        if self.items is None and not self._fits(item):
            self.items = self._held()
        if self.items is not None:
            self.items.append(item)
        else:
            values = (item[key] for key in self.keys) if self.keys is not None else item
            for position, value in enumerate(values):
                column = self.columns[position]
                if isinstance(column, _Slots):
                    if column.put(self.count, value):
                        continue
                    column = self.columns[position] = column.values(self.count)
                column.append(value)
        self.count += 1

    def result(self) -> Any:
        """The batch of the items added, as ``default_collation_fn`` collates them."""
        if self.items is not None:
            return default_collation_fn(self.items)
        columns = [
            column.result(self.count) if isinstance(column, _Slots) else combine_column(column, True, True)
            for column in self.columns
        ]
        return dict(zip(self.keys, columns)) if self.keys is not None else tuple(columns)

    def _fits(self, item: Any) -> bool:
        if self.keys is not None:
            return type(item) is dict and len(item) == self.length and all(key in item for key in self.keys)
        return type(item) is tuple and len(item) == self.length

    def _held(self) -> list:
        """The items added so far, rebuilt from the columns."""
        columns = [
            column.values(self.count) if isinstance(column, _Slots) else column for column in self.columns
        ]
        rows = list(zip(*columns))
        if self.keys is not None:
            return [dict(zip(self.keys, row)) for row in rows]
        return rows
