"""webdataset's ``autodecode`` module: decoders and handlers (wdsx's :mod:`wdsx.codecs.decode`)."""

from wdsx.codecs.decode import (
    BASIC_DECODERS,
    IMAGE_EXTENSIONS,
    Continue,
    Decoder,
    ImageHandler,
    basichandlers,
    cbor_loads,
    default_decoder,
    default_post_handlers,
    default_pre_handlers,
    gzfilter,
    handle_extension,
    imagehandler,
    imagespecs,
    msgpack_loads,
    npy_loads,
    npz_loads,
    tenbin_loads,
    torch_audio,
    torch_loads,
    torch_video,
    unpickle_loads,
)
from wdsx.core.errors import DecodingError
from wdsx.core.faces import absent_names

decoders = BASIC_DECODERS

ABSENT = {
    "pytorch_weights_only": "set WDS_PYTORCH_WEIGHTS_ONLY=1 in the environment (read at every torch.load)",
    "call_extension_handler": "use handle_extension(extensions, f), which makes the same handler",
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "IMAGE_EXTENSIONS",
    "Continue",
    "Decoder",
    "DecodingError",
    "ImageHandler",
    "basichandlers",
    "cbor_loads",
    "decoders",
    "default_decoder",
    "default_post_handlers",
    "default_pre_handlers",
    "gzfilter",
    "handle_extension",
    "imagehandler",
    "imagespecs",
    "msgpack_loads",
    "npy_loads",
    "npz_loads",
    "tenbin_loads",
    "torch_audio",
    "torch_loads",
    "torch_video",
    "unpickle_loads",
]
