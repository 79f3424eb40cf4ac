"""webdataset's ``writer`` module: the tar writers and the field encoders they use."""

from wdsx.codecs.encode import make_encoder
from wdsx.codecs.encoders import (
    add_handlers,
    bytestr,
    cbor_dumps,
    default_handlers,
    encode_based_on_extension,
    encode_based_on_extension1,
    imageencoder,
    make_handlers,
    mp_dumps,
    numpy_dumps,
    numpy_npz_dumps,
    tenbin_dumps,
    torch_dumps,
)
from wdsx.gopen import gopen
from wdsx.write.writer import ShardWriter, TarWriter

__all__ = [
    "ShardWriter",
    "TarWriter",
    "add_handlers",
    "bytestr",
    "cbor_dumps",
    "default_handlers",
    "encode_based_on_extension",
    "encode_based_on_extension1",
    "gopen",
    "imageencoder",
    "make_encoder",
    "make_handlers",
    "mp_dumps",
    "numpy_dumps",
    "numpy_npz_dumps",
    "tenbin_dumps",
    "torch_dumps",
]
