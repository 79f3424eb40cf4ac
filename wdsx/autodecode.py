"""webdataset's ``autodecode`` module: decoders and handlers (wdsx's :mod:`wdsx.codecs.decode`).

``pytorch_weights_only`` says whether ``.pth`` fields load with ``weights_only=True`` (in wdsx
always, unless ``WDSX_ALLOW_PICKLE=1``); assigning it sets ``WDS_PYTORCH_WEIGHTS_ONLY``, so
True forces weights-only loading and False alone never enables unpickling.
"""

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
from wdsx.codecs.legacydecode import call_extension_handler, weights_only
from wdsx.core.errors import DecodingError
from wdsx.core.faces import environment_setting, flag, live_settings

decoders = BASIC_DECODERS

live_settings(
    __name__,
    {
        "pytorch_weights_only": environment_setting(
            "WDS_PYTORCH_WEIGHTS_ONLY", weights_only, "torch.load's weights_only", flag
        )
    },
)

__all__ = [
    "IMAGE_EXTENSIONS",
    "Continue",
    "Decoder",
    "DecodingError",
    "ImageHandler",
    "basichandlers",
    "call_extension_handler",
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
