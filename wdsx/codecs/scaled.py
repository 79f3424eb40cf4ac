"""Decoding an image at the size it is trained at: a crop of it, resized, from a JPEG decoded at
a reduced scale where that gives enough pixels.

libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size for less work (simplejpeg's
``min_height``/``min_width``, Pillow's ``Image.draft``; both give the same pixels). A crop
that will be shrunk to the output size anyway needs only as many pixels as the output, so
:func:`resized_crop` decodes at the smallest of those scales at which the crop still has at
least ``floor`` times the output's size in each direction, then crops and resizes with
Pillow's antialiased bilinear filter, as torchvision's ``RandomResizedCrop`` does on a PIL
image. ``floor=1`` never gives the resize fewer pixels than the output; the pixels then differ
from crop-and-resize at full size only as libjpeg's scaled IDCT differs from decoding and
filtering (measured in the README).

The crop box is chosen in the image's own coordinates, before decoding, so the choice (and a
random one's draws) does not depend on the scale it is decoded at.
"""

from __future__ import annotations

import io
import math
from typing import NamedTuple

import numpy as np
import PIL.Image

from wdsx.core import rng
from wdsx.core.limits import check_image_pixels, max_image_pixels

try:
    import simplejpeg
except ImportError:  # pragma: no cover - exercised only where simplejpeg is missing
    simplejpeg = None

REDUCTIONS = (8, 4, 2, 1)
"""The scales libjpeg decodes at quickly (1/8 ... 1/1); other eighths are no faster than 1/1."""


class Box(NamedTuple):
    """A crop of an image, in its own pixel coordinates."""

    top: int
    left: int
    height: int
    width: int


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) of an encoded image, from its header."""
    if simplejpeg is not None:
        try:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            return height, width
        except ValueError:
            pass
    with PIL.Image.open(io.BytesIO(data)) as image:
        return image.height, image.width


def random_resized_box(
    seed: int, height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> Box:
    """torchvision's ``RandomResizedCrop.get_params``, drawing from the counter-based stream
    ``seed`` (:mod:`wdsx.core.rng`) instead of a global generator: up to ten tries at a box of
    a random area and aspect ratio that fits, else the central box of the nearest ratio."""
    area = height * width
    low, high = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(10):
        draws = 4 * attempt
        target = area * (scale[0] + (scale[1] - scale[0]) * rng.uniform(seed, draws))
        aspect = math.exp(low + (high - low) * rng.uniform(seed, draws + 1))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.below(seed, draws + 2, height - h + 1)
            left = rng.below(seed, draws + 3, width - w + 1)
            return Box(top, left, h, w)
    shape = width / height
    if shape < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif shape > max(ratio):
        w, h = int(round(height * max(ratio))), height
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)


def center_box(height: int, width: int, out_height: int, out_width: int) -> Box:
    """The largest central box with the output's aspect ratio (a resize of the shorter side
    followed by a central crop)."""
    scale = min(height / out_height, width / out_width)
    h, w = min(height, round(out_height * scale)), min(width, round(out_width * scale))
    return Box((height - h) // 2, (width - w) // 2, h, w)


def reduction(box: Box, out_height: int, out_width: int, floor: float) -> int:
    """The largest of :data:`REDUCTIONS` at which ``box`` keeps ``floor`` times the output's
    size on both sides (1 when ``floor`` is 0: no scaled decoding)."""
    if floor <= 0:
        return 1
    for factor in REDUCTIONS:
        if box.height / factor >= floor * out_height and box.width / factor >= floor * out_width:
            return factor
    return 1


def decode_reduced(data: bytes, factor: int, height: int, width: int) -> np.ndarray:
    """The image as RGB uint8, decoded at 1/``factor`` of its size where it is a JPEG libjpeg
    can scale (at full size otherwise, and for every other format). An image whose decoded
    pixels would be over the limit of :mod:`wdsx.core.limits` raises ValueError first."""
    wanted_height, wanted_width = -(-height // factor), -(-width // factor)
    if simplejpeg is not None:
        try:
            colorspace = simplejpeg.decode_jpeg_header(data)[2]
        except ValueError:
            colorspace = None
        if colorspace in ("YCbCr", "Gray"):
            check_image_pixels(wanted_height, wanted_width, max_image_pixels())
            return simplejpeg.decode_jpeg(
                data, colorspace="RGB", min_height=wanted_height, min_width=wanted_width
            )
    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        if factor > 1 and image.format == "JPEG":
            image.draft("RGB", (wanted_width, wanted_height))
        check_image_pixels(image.height, image.width, max_image_pixels())
        image.load()
        return np.asarray(image.convert("RGB"))


def resized_crop(
    data: bytes,
    size: tuple[int, int],
    box: Box,
    out_height: int,
    out_width: int,
    floor: float = 1.0,
    flip: bool = False,
) -> np.ndarray:
    """``box`` of the encoded image (of ``size``, its height and width) resized to the output
    size (antialiased bilinear), and mirrored left to right if ``flip``: an RGB uint8 array,
    height x width x 3. With ``floor=0`` the image is decoded at full size; otherwise see the
    module's description."""
    height, width = size
    factor = reduction(box, out_height, out_width, floor)
    array = decode_reduced(data, factor, height, width)
    scale_y, scale_x = array.shape[0] / height, array.shape[1] / width
    region = (
        box.left * scale_x,
        box.top * scale_y,
        (box.left + box.width) * scale_x,
        (box.top + box.height) * scale_y,
    )
    image = PIL.Image.fromarray(array).resize(
        (out_width, out_height), PIL.Image.Resampling.BILINEAR, box=region
    )
    if flip:
        image = image.transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)
