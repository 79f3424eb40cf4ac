"""Sample sizes measured once, when a shard is indexed, so that bucketing need not decode.

``wdsx index --sizes`` measures every sample of a shard and stores the numbers in its offset
index (:mod:`wdsx.read.index`). A measure is named ``<field>.<what>``:

* every image member (``jpg``, ``seg.png``...): ``<field>.width`` and ``<field>.height``, read
  from the image's header (Pillow's ``Image.open`` reads the header; the pixels are never
  decoded);
* with ``--tokens-field NAME``, every JSON value (a JSONL shard's line, a tar shard's ``json``
  member) holding a list under ``NAME``: ``json.NAME``, the length of that list.

A reader asked for them (``WebDataset(urls, sizes=True)``) gives each sample the measures of its
own members as ``sample["__sizes__"]``, e.g. ``{"jpg.width": 640, "jpg.height": 480}``.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from wdsx.core.jsontext import parse_json

SIZES = "__sizes__"
"""The sample field that holds a sample's measures, when a reader is asked for them."""

IMAGE_EXTENSIONS = frozenset(
    {"png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff", "ppm", "pgm", "pbm", "pnm"}
)
"""Member extensions measured as images (the last part of the field name: ``seg.png``)."""

ABSENT = -1
"""The stored value of a measure that a sample does not have (no such member)."""


def image_size(data: bytes) -> tuple[int, int]:
    """``(width, height)`` of an encoded image, from its header alone. A ValueError when
    Pillow cannot identify it, or when it has more pixels than twice Pillow's
    ``Image.MAX_IMAGE_PIXELS`` (an image that decoding would refuse as well)."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as image:
                return image.size
        except (OSError, SyntaxError, Image.DecompressionBombError) as exn:
            raise ValueError(f"not an image Pillow can measure ({exn})") from exn


def measure_sample(sample: Mapping[str, Any], list_fields: Sequence[str] = ()) -> dict[str, int]:
    """The measures of one sample as a shard reader yields it (members as bytes; a JSONL line
    as its parsed value under ``json``). A ValueError names the field that cannot be measured."""
    measures: dict[str, int] = {}
    for field, value in sample.items():
        if field.startswith("__"):
            continue
        extension = field.rsplit(".", 1)[-1]
        try:
            if extension in IMAGE_EXTENSIONS:
                measures[f"{field}.width"], measures[f"{field}.height"] = image_size(value)
            elif extension == "json" and list_fields:
                measures |= _list_lengths(field, value, list_fields)
        except ValueError as exn:
            raise ValueError(f"sample {sample.get('__key__')!r}, field {field!r}: {exn}") from exn
    return measures


def _list_lengths(field: str, value: Any, list_fields: Sequence[str]) -> dict[str, int]:
    """``<field>.<name>``: the length of the list under ``name`` in a JSON value (raw or parsed),
    for each of ``list_fields`` it holds."""
    parsed = parse_json(value) if isinstance(value, bytes | str) else value
    lengths = {}
    for name in list_fields:
        if isinstance(parsed, dict) and name in parsed:
            if not isinstance(parsed[name], list):
                raise ValueError(f"{name!r} holds a {type(parsed[name]).__name__}, not a list")
            lengths[f"{field}.{name}"] = len(parsed[name])
    return lengths


def columns(measured: Sequence[Mapping[str, int]]) -> dict[str, np.ndarray]:
    """One integer column per measure over the samples, in order; :data:`ABSENT` where a sample
    lacks it."""
    names = sorted({name for measures in measured for name in measures})
    return {
        name: np.array([measures.get(name, ABSENT) for measures in measured], dtype=np.int64)
        for name in names
    }


def row(sizes: Mapping[str, np.ndarray], ordinal: int) -> dict[str, int]:
    """The measures of sample ``ordinal`` from its index's columns (absent ones left out)."""
    return {name: int(column[ordinal]) for name, column in sizes.items() if column[ordinal] != ABSENT}
