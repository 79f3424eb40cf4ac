"""The small pieces of the ``.ten`` format webdataset exposes from its ``tenbin`` module.

Programs that read or write ``.ten`` headers themselves use these: the 8-character words of
a header as int64 (``str64``/``unstr64``), the magic word, the dtype table both ways, and
webdataset's checks on arrays and info strings. :mod:`wdsx.codecs.tenbin` is the codec.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from wdsx.codecs.tenbin import DTYPE_CODES, MAGIC

_WORD = struct.Struct("<q")
_SIXTY_FOUR_BIT = ("float64", "int64", "uint64")


def str64(s: str) -> int:
    """The int64 whose 8 bytes are ``s`` (ASCII, at most 8 characters) padded with NULs."""
    raw = s.encode("ascii")
    if len(raw) > 8:
        raise struct.error(f"str64: {s!r} is longer than 8 characters")
    return int(_WORD.unpack(raw.ljust(8, b"\0"))[0])


def unstr64(i: int) -> str:
    """The string whose 8 bytes make the int64 ``i``, without its NUL padding."""
    return _WORD.pack(i).decode("ascii").strip("\0")


magic_str = MAGIC.decode("ascii")
"""The magic word that starts every ``.ten`` buffer, as text."""
magic = str64(magic_str)
"""The magic word as an int64."""
short_to_long = {code: name for name, code in DTYPE_CODES.items()}
"""The header's dtype code -> numpy's dtype name."""


def bytelen(a: Any) -> int:
    """The number of bytes of an array (``nbytes``) or of a bytes object."""
    if hasattr(a, "nbytes"):
        return int(a.nbytes)
    if isinstance(a, (bytes, bytearray)):
        return len(a)
    raise ValueError(a, "cannot determine nbytes")


def bytedata(a: Any) -> Any:
    """The raw bytes of a bytes-like object (itself) or of an array (its ``data``)."""
    if isinstance(a, (bytes, bytearray, memoryview)):
        return a
    if hasattr(a, "data"):
        return a.data
    raise ValueError(a, "cannot return bytedata")


def check_acceptable_input_type(data: Sequence[Any], allow64: bool) -> None:
    """Raise ValueError unless every array has a dtype the format stores and, without
    ``allow64``, none is 64-bit."""
    for array in data:
        if array.dtype.name not in DTYPE_CODES:
            raise ValueError(f"unsupported datatype {array.dtype.name}")
        if not allow64 and array.dtype.name in _SIXTY_FOUR_BIT:
            raise ValueError("64 bit datatypes not allowed unless explicitly enabled")


def check_infos(data: Any, infos: Sequence[str], required_infos: Any = None) -> Any:
    """What decoding returns for ``required_infos``: ``data`` for None/False, ``(data,
    infos)`` for True; for a list, ``data`` once each required string matches the one found
    (ValueError otherwise)."""
    if required_infos is None or required_infos is False:
        return data
    if required_infos is True:
        return data, infos
    if not isinstance(required_infos, (tuple, list)):
        raise ValueError("required_infos must be tuple or list")
    for required, actual in zip(required_infos, infos):
        if required != actual:
            raise ValueError(f"actual info {actual} doesn't match required info {required}")
    return data
