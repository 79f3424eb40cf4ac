"""Small helpers of webdataset's ``filters`` module that programs import on their own: field
specs, decoder lookup by file name, and the pieces of webdataset's collation."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

from wdsx.stages.collate import combine_column
from wdsx.stages.plain import identity


def parse_field_spec(fields: str | Sequence[str]) -> list[list[str]]:
    """The alternatives of each field of a spec: ``"jpg;png cls"`` (or ``["jpg;png", "cls"]``)
    gives ``[["jpg", "png"], ["cls"]]``."""
    if isinstance(fields, str):
        fields = fields.split()
    return [field.split(";") for field in fields]


def find_decoder(decoders: Sequence[tuple[str, Any]], path: str) -> Any:
    """The decoder of the last ``(glob pattern, decoder)`` pair matching the lower-cased file
    name of ``path`` (with or without a leading dot); the identity for ``__`` names; None
    when no pattern matches."""
    name = path.rsplit("/", 1)[-1]
    if name.startswith("__"):
        return identity
    name = name.lower()
    for pattern, decoder in reversed(decoders):
        if fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch("." + name, pattern):
            return decoder
    return None


def combine_values(b: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    """One column ``b`` of a batch: numbers as a numpy array, arrays and tensors stacked (when
    combining), anything else as a list."""
    return combine_column(list(b), combine_tensors, combine_scalars)


def tuple2dict(l: Any) -> dict:  # noqa: E741 - webdataset's parameter name
    """A tuple or list ``l`` as a dict from position to value; a dict unchanged."""
    if isinstance(l, dict):
        return l
    return dict(enumerate(l))


def dict2tuple(d: dict[int, Any]) -> tuple:
    """The inverse of :func:`tuple2dict`: the values of ``d`` at positions ``0..max``."""
    return tuple(d[i] for i in range(1 + max(d.keys())))
