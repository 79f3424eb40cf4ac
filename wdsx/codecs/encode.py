"""Sample fields to bytes, chosen by extension: webdataset's writer table, made deterministic.

A field's encoder is picked by the last component of its extension, lower-cased (``seg.png``
uses ``png``); a trailing ``.gz`` gzips the result. Bytes pass through and any ``str`` is
UTF-8 encoded whatever the extension, as in webdataset. Unlike webdataset, the output is the
same on every run: gzip headers carry no timestamp, and PBM/PGM images are written instead of
failing. ``_``-prefixed fields are metadata and pass through unencoded.

A value an encoder cannot take is an :class:`EncodingError` naming the sample and the field,
whatever the encoder raised; so is a value that would not read back: ``None`` as a label, a
non-text value in a text field, an array of Python objects in ``.npy``/``.npz`` (readers load
those without pickle).
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import pickle
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from wdsx.codecs import tenbin
from wdsx.core.errors import EncodingError

Encoder = Callable[[dict[str, Any]], dict[str, Any]]
FieldEncoder = Callable[[Any], bytes]
BytesLike = (bytes, bytearray, memoryview)


def _ascii(value: Any) -> bytes:
    if value is None:
        raise ValueError("None is not a label (a class, count or index): was it missing?")
    return str(value).encode("ascii")


def _utf8(value: Any) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"text fields take str or bytes, not {type(value).__name__}")
    return value.encode("utf-8")


_OBJECT_ARRAY = (
    "an array of Python objects cannot be read back from .npy/.npz (readers refuse pickle); use .pyd"
)


def _plain_array(value: Any) -> np.ndarray:
    """``value`` as an array ``np.load`` reads back without pickle."""
    if value is None:
        raise ValueError("None is not an array")
    array = np.asanyarray(value)
    if array.dtype.hasobject:
        raise ValueError(_OBJECT_ARRAY)
    return array


def _json(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8")


def _torch(value: Any) -> bytes:
    import torch

    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def _npy(value: np.ndarray) -> bytes:
    stream = io.BytesIO()
    np.lib.format.write_array(stream, _plain_array(value))
    return stream.getvalue()


def _npz(value: Mapping[str, np.ndarray]) -> bytes:
    """The bytes ``np.savez_compressed(stream, **value)`` writes, for any array names.

    Written here rather than by numpy so that an array may be named like one of
    ``savez_compressed``'s own arguments (``file``, ``allow_pickle``).
    """
    if not isinstance(value, Mapping):
        raise ValueError(f"npz fields must be a dict of arrays, not {type(value).__name__}")
    arrays = {}
    for name, array in value.items():
        if not isinstance(name, str):
            raise ValueError(f"npz array names must be str, not {type(name).__name__} {name!r}")
        arrays[name] = _plain_array(array)
    stream = io.BytesIO()
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array)
    return stream.getvalue()


def _msgpack(value: Any) -> bytes:
    import msgpack

    return msgpack.packb(value)


def _cbor(value: Any) -> bytes:
    """CBOR with the ``cbor2`` package, else the older ``cbor`` one."""
    for package in ("cbor2", "cbor"):
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        return module.dumps(value)
    raise ValueError("encoding .cbor fields needs the cbor2 package")


def _tenbin(value: Any) -> bytes:
    """An array, or a list of arrays, in webdataset's tenbin format (decodes to a list)."""
    return tenbin.encode_buffer(value if isinstance(value, list) else [value])


def _image(pil_format: str, **save_options: Any) -> FieldEncoder:
    def encode(value: Any) -> bytes:
        from PIL import Image

        if isinstance(value, np.ndarray):
            value = Image.fromarray(_to_uint8(value))
        elif not isinstance(value, Image.Image):
            raise ValueError(f"image fields must be PIL images or numpy arrays, not {type(value).__name__}")
        stream = io.BytesIO()
        value.save(stream, format=pil_format, **save_options)
        return stream.getvalue()

    return encode


def _to_uint8(array: np.ndarray) -> np.ndarray:
    """An image array as uint8 (floats must lie in [0, 1]), with a single channel squeezed."""
    if array.dtype.kind == "f":
        low, high = float(np.min(array)), float(np.max(array))
        if low <= -0.001 or high >= 1.001:
            raise ValueError(f"float image values must lie in [0, 1], found {low}..{high}")
        array = (np.clip(array, 0.0, 1.0) * 255.0).astype(np.uint8)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim not in (2, 3):
        raise ValueError(f"image arrays must be HxW or HxWxC, not shape {array.shape}")
    return array


def _table(groups: Mapping[str, FieldEncoder]) -> dict[str, FieldEncoder]:
    return {ext: encoder for names, encoder in groups.items() for ext in names.split()}


DEFAULT_ENCODERS: dict[str, FieldEncoder] = _table(
    {
        "cls cls2 class count index inx id": _ascii,
        "txt text transcript html htm": _utf8,
        "pyd pickle": pickle.dumps,
        "pth": _torch,
        "npy": _npy,
        "npz": _npz,
        "ten tenbin tb": _tenbin,
        "json jsn": _json,
        "mp msgpack msg": _msgpack,
        "cbor": _cbor,
        "jpg jpeg img image": _image("JPEG", quality=100),
        "png": _image("PNG"),
        "pbm pgm ppm": _image("PPM"),
        "tiff tif": _image("TIFF"),
    }
)
"""Extension -> encoder, webdataset's table (same extensions, same formats)."""


def encode_field(value: Any, ext: str, encoders: Mapping[str, FieldEncoder] = DEFAULT_ENCODERS) -> Any:
    """The bytes for one field named ``ext``; ``_``-prefixed (metadata) fields are returned as is."""
    if ext[:1] == "_":
        return value
    compress = ext.endswith(".gz")
    if compress:
        ext = ext[:-3]
    if isinstance(value, BytesLike):
        data = value
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        last = ext.rsplit(".", 1)[-1].lower()
        encoder = encoders.get(last)
        if encoder is None:
            raise ValueError(f"no encoder for extension {last!r} (a {type(value).__name__}); pass bytes")
        data = encoder(value)
    return gzip.compress(data, mtime=0) if compress else data


def encode_sample(sample: Mapping[str, Any], encoders: Mapping[str, FieldEncoder] = DEFAULT_ENCODERS) -> dict:
    """Every field of ``sample`` encoded by :func:`encode_field`. Whatever an encoder raises
    (but a missing package or memory) becomes an :class:`EncodingError` naming the key and field."""
    result = {}
    for ext, value in sample.items():
        try:
            result[ext] = encode_field(value, ext, encoders)
        except (ImportError, MemoryError):
            raise
        except Exception as exn:
            reason = str(exn) if type(exn) is ValueError else f"{type(exn).__name__}: {exn}"
            raise EncodingError(reason, sample.get("__key__"), ext) from exn
    return result


def make_encoder(spec: bool | Mapping[str, FieldEncoder] | Encoder | None) -> Encoder:
    """A sample encoder from webdataset's ``encoder=`` argument.

    ``True``: the default table. ``False``/``None``: no encoding (fields must already be bytes
    or str). A dict: that extension table instead of the default one. A callable: used as is,
    on the whole sample.
    """
    if spec is True:
        return encode_sample
    if spec is False or spec is None:
        return dict
    if isinstance(spec, Mapping):
        table = dict(spec)
        return lambda sample: encode_sample(sample, table)
    if callable(spec):
        return spec
    raise ValueError(f"unknown encoder spec: {spec!r}")
