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
from wdsx.codecs.tenbinwords import (
    bytedata,
    bytelen,
    check_acceptable_input_type,
    check_infos,
    magic,
    magic_str,
    short_to_long,
    str64,
    unstr64,
)

long_to_short = DTYPE_CODES
magic_bytes = MAGIC

__all__ = [
    "bytedata",
    "bytelen",
    "check_acceptable_input_type",
    "check_infos",
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
    "magic",
    "magic_bytes",
    "magic_str",
    "read",
    "read_chunk",
    "roundup",
    "save",
    "short_to_long",
    "str64",
    "unstr64",
    "write",
    "write_chunk",
]
