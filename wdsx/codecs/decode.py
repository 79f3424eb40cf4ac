"""Decoding sample fields by extension, with webdataset's handlers and image specs.

A handler is ``f(key, data)`` with ``key`` like ``".jpg"`` or ``".seg.png"``; it returns the
decoded value, None to pass, or :class:`Continue` to hand transformed data to the remaining
handlers. For the handlers wdsx knows (basic types, images, ``handle_extension``, gzip) the
decoder works out once per extension which one applies, instead of asking every handler for
every field. JPEGs decode through ``simplejpeg`` when installed, giving the same arrays as
Pillow's default (accurate) decoder; Pillow is the fallback and handles every other format.

What a field may cost is bounded by :mod:`wdsx.core.limits`: an image over the pixel limit is
refused from its header, on simplejpeg's path as on Pillow's; a ``.gz`` field or an ``.npz``
field's members may not inflate beyond the inflation limits. Each refusal is a ValueError,
which :class:`Decoder` reports as a :class:`~wdsx.core.errors.DecodingError` naming the shard,
the sample and the field.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from wdsx.codecs import tenbin
from wdsx.core.astlock import AST_LOCK
from wdsx.core.compression import inflate
from wdsx.core.env import ALLOW_PICKLE, pickle_allowed, secure_mode
from wdsx.core.errors import DecodingError
from wdsx.core.jsontext import parse_json
from wdsx.core.limits import Inflation, check_image_pixels, max_image_pixels

if TYPE_CHECKING:
    import PIL.Image

try:
    import simplejpeg
except ImportError:  # pragma: no cover - exercised only where simplejpeg is missing
    simplejpeg = None

IMAGE_EXTENSIONS = (
    "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf png apng jp2 "
    "j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg msp pcd pxr pbm pgm ppm pnm "
    "psd bw rgb rgba sgi ras tga icb vda vst webp wmf emf xbm xpm"
).split()
_JPEG_EXTENSIONS = frozenset(("jpg", "jpeg", "jpe", "jfif"))
_FAST_COLORSPACES = ("YCbCr", "Gray")  # JPEGs simplejpeg decodes to RGB exactly as Pillow does

IMAGE_SPECS = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}
imagespecs = IMAGE_SPECS


def _weights_only() -> bool:
    """``torch.load``'s ``weights_only``: True unless pickle is allowed (``WDSX_ALLOW_PICKLE=1``,
    outside secure mode) and ``WDS_PYTORCH_WEIGHTS_ONLY`` is not ``1``."""
    return not pickle_allowed() or os.environ.get("WDS_PYTORCH_WEIGHTS_ONLY", "0") == "1"


def _refusal(what: str) -> str:
    """Why ``what`` (a phrase starting with a capital) is refused; in secure mode, in
    webdataset's words first, so that code matching them keeps working."""
    if secure_mode():
        return (
            f"{what} is not allowed for security reasons when enforce_security is set "
            "(secure mode, WDS_SECURE=1): pickle can run any code"
        )
    return (
        f"{what} is refused by default: pickle can run any code its author put in the shard. "
        f"Set {ALLOW_PICKLE}=1 if you trust where this data comes from"
    )


def torch_loads(data: bytes) -> Any:
    """``torch.load`` on CPU, with ``weights_only=True`` (tensors and plain containers only)
    unless pickle is allowed (:func:`wdsx.core.env.pickle_allowed`), as in PyTorch >= 2.6;
    refused in secure mode."""
    if secure_mode():
        raise ValueError(
            "torch.loads is not allowed for security reasons when enforce_security is set "
            "(secure mode, WDS_SECURE=1)"
        )
    import torch

    weights_only = _weights_only()
    try:
        return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")
    except pickle.UnpicklingError as exn:
        if not weights_only:
            raise
        raise ValueError(f"{_refusal('torch.load beyond weights')} ({exn})") from None


def unpickle_loads(data: bytes) -> Any:
    """``pickle.loads``, only when pickle is allowed (:func:`wdsx.core.env.pickle_allowed`)."""
    if not pickle_allowed():
        raise ValueError(_refusal("Unpickling"))
    return pickle.loads(data)


def npy_loads(data: bytes) -> np.ndarray:
    with AST_LOCK:  # numpy parses the header with ``ast``
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def npz_loads(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` field, once its members' declared sizes (which ``zipfile``
    holds them to) are found within the inflation limits for the field's size."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        declared = sum(member.file_size for member in archive.zip.infolist())
        inflation = Inflation.from_environment()
        if declared > inflation.allowed(len(data)):
            raise ValueError(f"the .npz archive is refused: {inflation.refusal(declared, len(data))}")
        with AST_LOCK:  # numpy parses each member's header with ``ast``
            return dict(archive)


def msgpack_loads(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(data)


def cbor_loads(data: bytes) -> Any:
    import cbor

    return cbor.loads(data)


def tenbin_loads(data: bytes) -> list[np.ndarray]:
    """The list of arrays in a ``.ten`` field (webdataset's tenbin format)."""
    return tenbin.decode_buffer(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


BASIC_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), _text),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id"), int),
    **dict.fromkeys(("json", "jsn"), parse_json),
    **dict.fromkeys(("pkl", "pickle", "pyd"), unpickle_loads),
    "pth": torch_loads,
    **dict.fromkeys(("ten", "tb"), tenbin_loads),
    **dict.fromkeys(("mp", "msg"), msgpack_loads),
    "npy": npy_loads,
    "npz": npz_loads,
    "cbor": cbor_loads,
}


def _last(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def basichandlers(key: str, data: bytes) -> Any:
    """Text, ints, JSON, pickle, torch, msgpack, numpy and CBOR by the last extension."""
    decoder = BASIC_DECODERS.get(_last(key))
    return None if decoder is None else decoder(data)


basichandlers.decoder_for = lambda ext: BASIC_DECODERS.get(_last(ext))  # type: ignore[attr-defined]


class Continue:
    """Returned by a handler to pass new data (and key) on to the following handlers."""

    def __init__(self, key: str, data: bytes):
        self.key, self.data = key, data


def gzfilter(key: str, data: bytes) -> Continue | None:
    """Decompress ``.gz`` fields and continue decoding them under the inner extension."""
    if not key.endswith(".gz"):
        return None
    return Continue(key[:-3], inflate(data))


def open_image(data: bytes) -> PIL.Image.Image:
    """``data`` opened by Pillow (its header read, no pixel decoded yet). For bytes in no format
    Pillow knows, Pillow's error names its in-memory buffer (``<_io.BytesIO object at
    0x...>``), which tells a reader nothing: this raises the same error type saying what is
    wrong instead."""
    import PIL.Image

    try:
        return PIL.Image.open(io.BytesIO(data))
    except PIL.UnidentifiedImageError:
        raise PIL.UnidentifiedImageError("not an image format Pillow recognises") from None


class ResolvedHandler:
    """A handler that knows, from the field's key alone, which function decodes it
    (:meth:`decoder_for`); the decoder asks it once per extension instead of once per field."""

    def decoder_for(self, key: str) -> Callable[[bytes], Any] | None:
        raise NotImplementedError

    def __call__(self, key: str, data: bytes) -> Any:
        decoder = self.decoder_for(key)
        return None if decoder is None else decoder(data)


class ImageHandler(ResolvedHandler):
    """Decode images by spec: ``"rgb8"`` (numpy uint8 HWC), ``"torchrgb"`` (float CHW), ``"pil"``...

    JPEGs decoded to RGB go through simplejpeg when it is installed (bit-identical to Pillow's
    default decoder, and faster); everything else goes through Pillow. Images over the pixel
    limit in force when the handler is made (:func:`~wdsx.core.limits.max_image_pixels`) are
    refused on both paths before they are decoded.
    """

    def __init__(self, imagespec: str, extensions: Sequence[str] = IMAGE_EXTENSIONS):
        if imagespec not in IMAGE_SPECS:
            raise ValueError(f"unknown image spec {imagespec!r}; choose one of {', '.join(IMAGE_SPECS)}")
        self.imagespec = imagespec
        self.extensions = frozenset(ext.lower() for ext in extensions)
        self.atype, self.etype, self.mode = IMAGE_SPECS[self.imagespec]
        self.max_pixels = max_image_pixels()

    def decoder_for(self, key: str) -> Callable[[bytes], Any] | None:
        ext = _last(key).lower()
        if ext not in self.extensions:
            return None
        if simplejpeg is not None and ext in _JPEG_EXTENSIONS and self.mode == "rgb" and self.atype != "pil":
            return self._decode_jpeg
        return self._decode_pil

    def _decode_jpeg(self, data: bytes) -> Any:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return self._decode_pil(data)
        if colorspace not in _FAST_COLORSPACES:
            return self._decode_pil(data)
        check_image_pixels(height, width, self.max_pixels)
        return self._finish(simplejpeg.decode_jpeg(data, colorspace="RGB"))

    def into_decoder_for(self, key: str) -> Callable[[bytes, np.ndarray], bool] | None:
        """For spec ``rgb8`` and a JPEG extension: a function that decodes such a field
        straight into a given uint8 height x width x 3 array (a slot of a batch), giving the
        same pixels as :meth:`decoder_for`'s. It returns False, leaving the array alone, for
        a JPEG that needs Pillow or whose size differs. None where there is no such path."""
        fast = self.decoder_for(key) == self._decode_jpeg
        return self._decode_jpeg_into if fast and self.imagespec == "rgb8" else None

    def _decode_jpeg_into(self, data: bytes, out: np.ndarray) -> bool:
        try:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
        except ValueError:
            return False
        # the slot has the shape of the batch's first image, which passed the pixel limit
        if colorspace not in _FAST_COLORSPACES or out.shape != (height, width, 3):
            return False
        simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out)
        return True

    def _decode_pil(self, data: bytes) -> Any:
        with open_image(data) as opened:
            check_image_pixels(opened.height, opened.width, self.max_pixels)
            opened.load()
            # a converted copy only where the mode differs
            image = opened if opened.mode == self.mode.upper() else opened.convert(self.mode.upper())
        if self.atype == "pil":
            return image
        return self._finish(np.asarray(image))

    def _finish(self, array: np.ndarray) -> Any:
        if self.etype == "float":
            array = array.astype(np.float32) / 255.0
        if self.atype == "torch":
            import torch

            if array.ndim == 3:
                array = array.transpose(2, 0, 1)
            array = np.ascontiguousarray(array)
            return torch.from_numpy(array if array.flags.writeable else array.copy())
        return array


def imagehandler(imagespec: str, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """Lower-case alias of :class:`ImageHandler`, as in webdataset."""
    return ImageHandler(imagespec, extensions)


class ExtensionHandler(ResolvedHandler):
    """Calls ``f(data)`` for fields whose extension ends with one of ``extensions``
    (multi-part extensions such as ``"seg.png"`` need that many components to match)."""

    def __init__(self, extensions: str, f: Callable[[bytes], Any]):
        self.extensions = [tuple(ext.split(".")) for ext in extensions.lower().split()]
        self.f = f

    def decoder_for(self, key: str) -> Callable[[bytes], Any] | None:
        parts = tuple(key.lower().split("."))
        for target in self.extensions:
            if len(target) <= len(parts) and parts[-len(target) :] == target:
                return self.f
        return None


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> ExtensionHandler:
    """A handler that applies ``f`` to fields with the given space-separated extensions."""
    return ExtensionHandler(extensions, f)


def _media_file(key: str, data: bytes, extensions: Sequence[str], load: Callable[[str], Any]) -> Any:
    import tempfile

    ext = _last(key)
    if ext not in extensions:
        return None
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"file.{ext}")
        with open(path, "wb") as stream:
            stream.write(data)
        return load(path)


def torch_video(key: str, data: bytes) -> Any:
    """Decode video with torchvision (install it yourself; wdsx does not depend on it)."""

    def load(path: str) -> Any:
        import torchvision.io

        return torchvision.io.read_video(path, pts_unit="sec")

    return _media_file(key, data, "mp4 ogv mjpeg avi mov h264 mpg webm wmv".split(), load)


def torch_audio(key: str, data: bytes) -> Any:
    """Decode audio with torchaudio (install it yourself; wdsx does not depend on it)."""

    def load(path: str) -> Any:
        import torchaudio

        return torchaudio.load(path)

    return _media_file(key, data, "flac mp3 sox wav m4a ogg wma".split(), load)


default_pre_handlers = [gzfilter]
default_post_handlers = [basichandlers]


class Decoder:
    """Decode every field of a sample with a list of handlers (first non-None result wins).

    Fields starting with ``__`` are metadata: bytes become text, anything else passes.
    ``only`` limits decoding to the named fields; ``partial`` leaves non-bytes fields alone.
    """

    def __init__(
        self,
        handlers: Sequence[Callable],
        pre: Sequence[Callable] | None = None,
        post: Sequence[Callable] | None = None,
        only: Sequence[str] | str | None = None,
        partial: bool = False,
    ):
        if isinstance(only, str):
            only = only.split()
        self.only = None if only is None else set(only)
        self.handlers = list(default_pre_handlers if pre is None else pre)
        self.handlers += list(handlers)
        self.handlers += list(default_post_handlers if post is None else post)
        for handler in self.handlers:
            if not callable(handler):
                raise ValueError(f"decoder handler {handler!r} is not callable")
        self.partial = partial
        self._plans: dict[str, tuple] = {}

    def _plan(self, key: str) -> tuple:
        """The handlers that can apply to ``key``, with known handlers resolved to their
        decoding function; a known handler that applies ends the list (it never passes)."""
        plan = self._plans.get(key)
        if plan is None:
            steps = []
            for handler in self.handlers:
                if handler is gzfilter:
                    if key.endswith(".gz"):
                        steps.append(("call", handler))
                        break
                    continue
                resolve = getattr(handler, "decoder_for", None)
                if resolve is None:
                    steps.append(("call", handler))
                    continue
                decoder = resolve(key)
                if decoder is not None:
                    steps.append(("data", decoder))
                    break
            plan = self._plans[key] = tuple(steps)
        return plan

    def decode1(self, key: str, data: bytes | bytearray) -> Any:
        """Decode one field (bytes, or a bytearray a reader handed over without copying);
        ``key`` is its extension without the leading dot."""
        key = "." + key
        while True:
            for kind, handler in self._plan(key):
                result = handler(data) if kind == "data" else handler(key, data)
                if isinstance(result, Continue):
                    key, data = result.key, result.data
                    break
                if result is not None:
                    return result
            else:
                return data

    def decode(self, sample: dict[str, Any]) -> dict[str, Any]:
        result = {}
        only, partial = self.only, self.partial
        for k, v in sample.items():
            try:
                if k[:2] == "__":
                    if isinstance(v, bytes):
                        try:
                            v = v.decode("utf-8")
                        except UnicodeDecodeError:
                            pass
                    result[k] = v
                elif only is not None and k not in only:
                    result[k] = v
                elif not isinstance(v, (bytes, bytearray)):
                    if not partial:
                        raise ValueError(f"field {k!r} is {type(v).__name__}, not bytes (use partial=True)")
                    result[k] = v
                else:
                    result[k] = self.decode1(k, v)
            except Exception as exn:
                position = sample.get("__position__")
                offset = position[1] if isinstance(position, tuple) and len(position) > 1 else None
                raise DecodingError(
                    sample.get("__url__"), sample.get("__key__"), k, sample, exn, offset
                ) from exn
        return result

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(sample, dict):
            raise ValueError(f"decode expects dict samples, got {type(sample).__name__}")
        return self.decode(sample)


default_decoder = Decoder([])
