"""``decode_resized``: decode a sample with its images decoded straight to the training size.

Like ``decode(spec)``, but each image field comes out as a ``size`` crop: random (torchvision's
``RandomResizedCrop``), central, or the whole image, optionally mirrored, decoded at a reduced
JPEG scale where the crop does not need every pixel (:mod:`wdsx.codecs.scaled`). The other
fields decode as ``decode()`` decodes them.

A random crop or flip is drawn from the sample's own seed (:mod:`wdsx.core.sampleseed`: the
pipeline seed, the epoch and the sample key), so it is the same on any number of workers or
ranks and after a resume, and new each epoch; the stage is a pure function of the sample.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import PIL.Image

from wdsx.codecs import scaled
from wdsx.codecs.decode import IMAGE_SPECS, Decoder, ImageHandler, ResolvedHandler
from wdsx.core import rng
from wdsx.core.errors import Handler, reraise_exception
from wdsx.core.sampleseed import sample_seed
from wdsx.stages.transforms import Transform

CROPS = ("random", "center", "none")


class _ResizedImages(ResolvedHandler):
    """Decodes the image fields of the sample being decoded (its seed in :attr:`seed`)."""

    def __init__(
        self,
        spec: str,
        size: tuple[int, int],
        crop: str,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        flip: bool,
        floor: float,
    ):
        if IMAGE_SPECS.get(spec, (None, None, None))[2] != "rgb":
            raise ValueError(f"decode_resized makes RGB images; spec {spec!r} is not one of the RGB specs")
        if crop not in CROPS:
            raise ValueError(f"crop must be one of {CROPS}, not {crop!r}")
        self.output = ImageHandler(spec)
        self.size, self.crop, self.scale, self.ratio, self.flip, self.floor = (
            size,
            crop,
            scale,
            ratio,
            flip,
            floor,
        )
        self.seed = 0

    @property
    def random(self) -> bool:
        return self.crop == "random" or self.flip

    def decoder_for(self, key: str) -> Callable[[bytes], Any] | None:
        return None if self.output.decoder_for(key) is None else self._decode

    def _decode(self, data: bytes) -> Any:
        out_height, out_width = self.size
        height, width = scaled.image_size(data)
        if self.crop == "random":
            box = scaled.random_resized_box(
                rng.derive_seed("crop", self.seed), height, width, self.scale, self.ratio
            )
        elif self.crop == "center":
            box = scaled.center_box(height, width, out_height, out_width)
        else:
            box = scaled.Box(0, 0, height, width)
        flip = self.flip and rng.uniform(rng.derive_seed("flip", self.seed), 0) < 0.5
        array = scaled.resized_crop(data, (height, width), box, out_height, out_width, self.floor, flip)
        if self.output.atype == "pil":
            return PIL.Image.fromarray(array)
        return self.output._finish(array)


class _SampleDecoder(Decoder):
    """A decoder that tells its resizing handler which sample it is decoding."""

    def __init__(self, images: _ResizedImages):
        super().__init__([images])
        self.images = images

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self.images.random:
            self.images.seed = sample_seed(sample)
        return super().__call__(sample)


def decode_resized(
    size: int | tuple[int, int],
    crop: str = "random",
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = False,
    spec: str = "rgb8",
    scaled_decoding: bool | float = True,
    handler: Handler = reraise_exception,
) -> Transform:
    """Decode samples with image fields as ``size`` (an int, or height and width) crops.

    ``crop``: ``"random"`` (area ``scale`` and aspect ``ratio`` ranges as torchvision's
    ``RandomResizedCrop``), ``"center"`` (the largest central box of the output's shape) or
    ``"none"`` (the whole image, stretched). ``flip``: mirror left to right with probability
    1/2. ``spec``: an RGB image spec (``rgb8``, ``torchrgb8``, ``rgb``, ``torchrgb``,
    ``pil``...). ``scaled_decoding``: decode JPEGs at 1/2, 1/4 or 1/8 scale where the crop
    keeps at least this many times the output's size (True: 1, never fewer pixels than the
    output; False: always full size).
    """
    shape = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    floor = 1.0 if scaled_decoding is True else float(scaled_decoding)
    images = _ResizedImages(spec, shape, crop, scale, ratio, flip, floor)
    label = (
        f"decode_resized({shape[0]}x{shape[1]}, crop={crop}, scale={scale}, ratio={ratio}, "
        f"flip={flip}, spec={spec}, scaled={floor})"
    )
    return Transform(_SampleDecoder(images), label, handler)
