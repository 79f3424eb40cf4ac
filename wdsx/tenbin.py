"""webdataset's ``tenbin`` module: the ``.ten`` array format (wdsx's :mod:`wdsx.codecs.tenbin`)."""

from wdsx.codecs.tenbin import (
    DTYPE_CODES,
    MAGIC,
    decode_buffer,
    decode_chunks,
    decode_header,
    decode_list,
    encode_buffer,
    encode_chunks,
    encode_header,
    encode_list,
    load,
    read,
    read_chunk,
    roundup,
    save,
    write,
    write_chunk,
)
from wdsx.core.faces import absent_names

long_to_short = DTYPE_CODES
magic_bytes = MAGIC

_INTERNAL = "an internal step of the format; use encode_buffer/decode_buffer, read/write or save/load"
ABSENT = {
    name: _INTERNAL
    for name in (
        "str64",
        "unstr64",
        "magic",
        "magic_str",
        "short_to_long",
        "bytelen",
        "bytedata",
        "check_acceptable_input_type",
        "check_infos",
    )
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "decode_buffer",
    "decode_chunks",
    "decode_header",
    "decode_list",
    "encode_buffer",
    "encode_chunks",
    "encode_header",
    "encode_list",
    "load",
    "long_to_short",
    "magic_bytes",
    "read",
    "read_chunk",
    "roundup",
    "save",
    "write",
    "write_chunk",
]
