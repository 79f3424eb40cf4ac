"""How a packed row is laid out, and how rows are batched for variable-length attention.

A row is a dict: the tokens under the packed field (``length`` of them, padded at the end),
``segment_ids`` (1, 2, ... for the row's segments, 0 on padding), ``position_ids`` (each
segment counts from 0; 0 on padding), ``cu_seqlens`` (the segments' cumulative lengths from 0,
as flash-attention's varlen functions take them; the last is the row's count of real tokens),
``__keys__`` (each segment's document key) and ``__starts__`` (where each segment starts inside
its document: 0 unless it continues a document split at an earlier row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from wdsx.stages.packing.strategies import Piece

SEGMENT_IDS = "segment_ids"
POSITION_IDS = "position_ids"
CU_SEQLENS = "cu_seqlens"
KEYS = "__keys__"
STARTS = "__starts__"

INDEX_TYPE = np.int32
"""The type of segment ids, position ids and cu_seqlens (flash-attention wants int32)."""


class RowBuilder:
    """Lays out rows of ``length`` tokens of type ``dtype`` under ``field``, padded with ``pad``."""

    def __init__(self, field: str, length: int, pad: int, dtype: np.dtype):
        self.field = field
        self.length = length
        self.pad = pad
        self.dtype = dtype
        self.counting = np.arange(length, dtype=INDEX_TYPE)

    def build(self, pieces: Sequence[Piece]) -> dict[str, Any]:
        """The row holding ``pieces`` in order: a few slice copies per segment, nothing that
        loops over tokens in Python."""
        length, counting = self.length, self.counting
        tokens = np.empty(length, dtype=self.dtype)
        segment_ids = np.empty(length, dtype=INDEX_TYPE)
        position_ids = np.empty(length, dtype=INDEX_TYPE)
        cu_seqlens = np.empty(len(pieces) + 1, dtype=INDEX_TYPE)
        cu_seqlens[0] = used = 0
        for segment, (document, begin, end) in enumerate(pieces, 1):
            after = used + end - begin
            tokens[used:after] = document.tokens[begin:end]
            segment_ids[used:after] = segment
            position_ids[used:after] = counting[: after - used]
            cu_seqlens[segment] = used = after
        tokens[used:] = self.pad
        segment_ids[used:] = 0
        position_ids[used:] = 0
        return {
            self.field: tokens,
            SEGMENT_IDS: segment_ids,
            POSITION_IDS: position_ids,
            CU_SEQLENS: cu_seqlens,
            KEYS: [document.key for document, _, _ in pieces],
            STARTS: np.array([begin for _, begin, _ in pieces], dtype=np.int64),
        }


def collate_packed(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of packed rows for variable-length attention over the flattened batch
    (``batch * length`` tokens): the row-shaped fields stacked to ``(batch, length)``,
    ``cu_seqlens`` over the flattened tokens (each row's padding counted as one more segment,
    so that every row starts at a multiple of ``length``), ``max_seqlen`` the longest segment,
    and the other fields as lists. Use it as ``batched(n, collation_fn=wdsx.collate_packed)``."""
    if not rows:
        raise ValueError("collate_packed needs at least one row")
    first = rows[0]
    per_row = (CU_SEQLENS, STARTS)
    stacked = [name for name, value in first.items() if isinstance(value, np.ndarray) and name not in per_row]
    batch: dict[str, Any] = {name: np.stack([row[name] for row in rows]) for name in stacked}
    length = batch[stacked[0]].shape[1]
    bounds = [np.zeros(1, dtype=INDEX_TYPE)]
    for number, row in enumerate(rows):
        ends = row[CU_SEQLENS][1:]
        if not len(ends) or ends[-1] < length:
            ends = np.append(ends, INDEX_TYPE(length))
        bounds.append(ends + INDEX_TYPE(number * length))
    cu_seqlens = np.concatenate(bounds).astype(INDEX_TYPE)
    batch[CU_SEQLENS] = cu_seqlens
    batch["max_seqlen"] = int(np.diff(cu_seqlens).max())
    for name in first:
        if name not in batch:
            batch[name] = [row[name] for row in rows]
    return batch
