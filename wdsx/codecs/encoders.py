"""webdataset's names for the writer's field encoders and for building encoder tables.

The encoders themselves are those of :mod:`wdsx.codecs.encode` (found by extension in its
table); this module gives them webdataset's names (``numpy_dumps``, ``torch_dumps``...) and
provides webdataset's helpers for custom tables, which a ``TarWriter(encoder=table)`` accepts::

    handlers = make_handlers()
    add_handlers(handlers, "seg", encode_segmentation)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wdsx.codecs.encode import DEFAULT_ENCODERS, FieldEncoder, encode_field, encode_sample

torch_dumps = DEFAULT_ENCODERS["pth"]
numpy_dumps = DEFAULT_ENCODERS["npy"]
numpy_npz_dumps = DEFAULT_ENCODERS["npz"]
tenbin_dumps = DEFAULT_ENCODERS["ten"]
mp_dumps = DEFAULT_ENCODERS["msgpack"]
cbor_dumps = DEFAULT_ENCODERS["cbor"]

default_handlers: Mapping[str, FieldEncoder] = DEFAULT_ENCODERS
"""The default extension -> encoder table (read-only use; copy it with :func:`make_handlers`)."""

_IMAGE_FORMATS = {"jpg": "jpg", "jpeg": "jpg", "png": "png", "ppm": "ppm", "pgm": "pgm", "pbm": "pbm"}
_IMAGE_FORMATS.update(tiff="tiff", tif="tiff", img="jpg", image="jpg")


def make_handlers() -> dict[str, FieldEncoder]:
    """A fresh copy of the default extension -> encoder table, to extend."""
    return dict(DEFAULT_ENCODERS)


def add_handlers(table: dict[str, FieldEncoder], keys: str | list[str], value: FieldEncoder) -> None:
    """Use ``value`` for each of ``keys`` (a list or a space-separated string of extensions)."""
    for key in keys.split() if isinstance(keys, str) else keys:
        table[key] = value


def encode_based_on_extension1(data: Any, tname: str, handlers: Mapping[str, FieldEncoder]) -> Any:
    """One field's bytes, the encoder chosen by the last extension of ``tname``."""
    return encode_field(data, tname, handlers)


def encode_based_on_extension(sample: Mapping[str, Any], handlers: Mapping[str, FieldEncoder]) -> dict:
    """Every field of a sample encoded with ``handlers``."""
    return encode_sample(sample, handlers)


def imageencoder(image: Any, format: str = "PNG") -> bytes:  # noqa: A002 - webdataset's name
    """A PIL image or an HxW[xC] array (uint8, or floats in [0, 1]) as ``format`` bytes
    (``"PNG"``, ``"jpg"``, ``"tiff"``, ``"ppm"``...; JPEG at quality 100)."""
    ext = _IMAGE_FORMATS.get(format.lower())
    if ext is None:
        raise ValueError(f"imageencoder: unknown format {format!r}; use one of {sorted(_IMAGE_FORMATS)}")
    return DEFAULT_ENCODERS[ext](image)


def bytestr(data: Any) -> bytes:
    """Bytes as they are; anything else as the ASCII bytes of its ``str``."""
    return data if isinstance(data, bytes) else str(data).encode("ascii")
