"""The tenbin array format (``.ten`` fields), byte for byte as webdataset writes and reads it.

A buffer is a sequence of chunks; each chunk is the 8 bytes ``~TenBin~``, its length as a
little-endian int64, then its bytes zero-padded to a multiple of 64. An array is two chunks:
a header of int64 words (dtype code such as ``"f4"`` in 8 ASCII bytes, an 8-byte info string,
the number of dimensions, the dimensions) and the raw little-endian data. Decoding returns
arrays that view the buffer (no copy), read-only when the buffer is ``bytes``.

webdataset writes in the machine's byte order; wdsx always writes little-endian, which is the
same bytes on every machine webdataset runs on in practice. Unlike webdataset 1.0.2 (whose dtype
table misspells ``uint32``), ``uint32`` arrays can be written and read; 0-d arrays work too.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import numpy as np

MAGIC = b"~TenBin~"
ALIGN = 64
MAX_DIMS = 9
_LENGTH = struct.Struct("<q")

DTYPE_CODES = {
    "float16": "f2",
    "float32": "f4",
    "float64": "f8",
    "int8": "i1",
    "int16": "i2",
    "int32": "i4",
    "int64": "i8",
    "uint8": "u1",
    "uint16": "u2",
    "uint32": "u4",
    "uint64": "u8",
}
"""numpy dtype name -> the code stored in a header."""
_DTYPES = {code: np.dtype(name).newbyteorder("<") for name, code in DTYPE_CODES.items()}

Infos = bool | Sequence[str]
"""What decoding returns besides the arrays: False (nothing), True (the info strings), or a
list of info strings the buffer must carry (checked, then only the arrays are returned)."""


def roundup(n: int, k: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``k`` (chunks are padded to 64 bytes)."""
    return k * ((n + k - 1) // k)


def _word(text: str) -> bytes:
    raw = text.encode("ascii")
    if len(raw) > 8:
        raise ValueError(f"tenbin: info and dtype strings hold at most 8 ASCII characters, got {text!r}")
    return raw.ljust(8, b"\0")


def encode_header(array: np.ndarray, info: str = "") -> bytes:
    """The header chunk's bytes for ``array``."""
    if array.ndim > MAX_DIMS:
        raise ValueError(f"tenbin: arrays have at most {MAX_DIMS} dimensions, got {array.ndim}")
    code = DTYPE_CODES.get(array.dtype.name)
    if code is None:
        raise ValueError(f"tenbin: unsupported dtype {array.dtype}; use one of {', '.join(DTYPE_CODES)}")
    sizes = np.array([array.ndim, *array.shape], dtype="<i8")
    return _word(code) + _word(info) + sizes.tobytes()


def decode_header(header: bytes | memoryview) -> tuple[tuple[int, ...], np.dtype, str]:
    """``(shape, dtype, info)`` from a header chunk."""
    raw = bytes(header)
    code = raw[:8].rstrip(b"\0").decode("ascii")
    if code not in _DTYPES:
        raise ValueError(f"tenbin: unsupported dtype code {code!r}")
    info = raw[8:16].rstrip(b"\0").decode("ascii")
    ndim = _LENGTH.unpack_from(raw, 16)[0]
    if not 0 <= ndim <= MAX_DIMS or len(raw) < 24 + 8 * ndim:
        raise ValueError(f"tenbin: corrupt header ({ndim} dimensions in {len(raw)} bytes)")
    shape = tuple(int(n) for n in np.frombuffer(raw, dtype="<i8", count=ndim, offset=24))
    return shape, _DTYPES[code], info


def _little_endian(array: Any) -> np.ndarray:
    array = np.asarray(array)
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and sys.byteorder == "big"):
        array = array.astype(array.dtype.newbyteorder("<"))
    return array if array.flags.c_contiguous else array.copy(order="C")


def encode_list(arrays: Sequence[Any], infos: Sequence[str] | None = None) -> list[bytes | memoryview]:
    """Header and data chunks, alternating, for each array; ``infos`` gives one info string
    per array (default: empty strings)."""
    if infos is None:
        infos = [""] * len(arrays)
    elif len(infos) != len(arrays):
        raise ValueError(f"tenbin: {len(infos)} info strings for {len(arrays)} arrays")
    chunks: list[bytes | memoryview] = []
    for array, info in zip(arrays, infos):
        array = _little_endian(array)
        chunks += [encode_header(array, info), array.reshape(-1).data.cast("B")]
    return chunks


def decode_list(chunks: Sequence[bytes | memoryview], infos: Infos = False) -> Any:
    """Arrays from alternating header and data chunks (see :data:`Infos` for ``infos``)."""
    if len(chunks) % 2:
        raise ValueError("tenbin: a header chunk has no data chunk")
    arrays, found = [], []
    for header, data in zip(chunks[::2], chunks[1::2]):
        shape, dtype, info = decode_header(header)
        count = int(np.prod(shape, dtype=np.int64))
        arrays.append(np.frombuffer(data, dtype=dtype, count=count).reshape(shape))
        found.append(info)
    return _with_infos(arrays, found, infos)


def _with_infos(arrays: list[np.ndarray], found: list[str], infos: Infos) -> Any:
    if infos is True:
        return arrays, found
    if infos is not False and infos is not None:
        if list(infos) != found[: len(infos)]:
            raise ValueError(f"tenbin: info strings {found} do not match the required {list(infos)}")
    return arrays


def _chunk_parts(chunk: bytes | memoryview) -> Iterator[bytes | memoryview]:
    size = len(chunk)
    yield MAGIC
    yield _LENGTH.pack(size)
    yield chunk
    yield bytes(roundup(size) - size)


def encode_chunks(chunks: Sequence[bytes | memoryview]) -> bytes:
    """One buffer holding ``chunks``, each with its magic, length and padding."""
    return b"".join(part for chunk in chunks for part in _chunk_parts(chunk))


def decode_chunks(buffer: bytes | bytearray | memoryview) -> list[memoryview]:
    """The chunks of a buffer, as views into it."""
    view = memoryview(buffer).cast("B")
    chunks, offset = [], 0
    while offset < len(view):
        if view[offset : offset + 8] != MAGIC:
            raise ValueError(f"tenbin: no chunk magic at byte {offset}")
        size = _LENGTH.unpack_from(view, offset + 8)[0]
        start = offset + 16
        if size < 0 or start + size > len(view):
            raise ValueError(f"tenbin: chunk at byte {offset} claims {size} bytes past the buffer's end")
        chunks.append(view[start : start + size])
        offset = start + roundup(size)
    return chunks


def encode_buffer(arrays: Sequence[Any], infos: Sequence[str] | None = None) -> bytes:
    """The tenbin bytes for a list of arrays (what a ``.ten`` field holds)."""
    if not isinstance(arrays, (list, tuple)):
        raise ValueError("tenbin: encode_buffer takes a list of arrays")
    return encode_chunks(encode_list(arrays, infos))


def decode_buffer(buffer: bytes | bytearray | memoryview, infos: Infos = False) -> Any:
    """The list of arrays in a tenbin buffer (see :data:`Infos` for ``infos``)."""
    return decode_list(decode_chunks(buffer), infos)


def write_chunk(stream: BinaryIO, chunk: bytes | memoryview) -> None:
    """Write one chunk with its magic, length and padding."""
    for part in _chunk_parts(chunk):
        stream.write(part)


def read_chunk(stream: BinaryIO) -> bytes | None:
    """The next chunk of a stream, or None at its end."""
    magic = stream.read(8)
    if not magic:
        return None
    if magic != MAGIC:
        raise ValueError("tenbin: the stream does not continue with a chunk magic")
    size = _LENGTH.unpack(stream.read(8))[0]
    if size < 0:
        raise ValueError(f"tenbin: negative chunk length {size}")
    data = stream.read(size)
    if len(data) != size:
        raise ValueError("tenbin: the stream ends inside a chunk")
    stream.read(roundup(size) - size)
    return data


def write(stream: BinaryIO, arrays: Sequence[Any], infos: Sequence[str] | None = None) -> None:
    """Write arrays to a binary stream, chunk by chunk."""
    for chunk in encode_list(arrays, infos):
        write_chunk(stream, chunk)


def read(stream: BinaryIO, n: int = sys.maxsize, infos: Infos = False) -> Any:
    """Read up to ``n`` arrays from a binary stream."""
    chunks: list[bytes | memoryview] = []
    for _ in range(n):
        header = read_chunk(stream)
        if header is None:
            break
        data = read_chunk(stream)
        if data is None:
            raise ValueError("tenbin: the stream ends after an array header")
        chunks += [header, data]
    return decode_list(chunks, infos)


def _check_name(fname: str, nocheck: bool) -> None:
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError(f"tenbin: file name {fname!r} should end in .ten (or pass nocheck=True)")


def save(fname: str, *arrays: Any, infos: Sequence[str] | None = None, nocheck: bool = False) -> None:
    """Write arrays to a ``.ten`` file."""
    _check_name(fname, nocheck)
    with open(fname, "wb") as stream:
        write(stream, arrays, infos)


def load(fname: str, infos: Infos = False, nocheck: bool = False) -> Any:
    """Read the arrays of a ``.ten`` file."""
    _check_name(fname, nocheck)
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
