"""``wdsx preview``: a PNG contact sheet of a dataset's first samples, for a person to look at.

Each sample gets one tile: its first image field, centred in a SIZE x SIZE box (shrunk to fit,
or enlarged by the largest whole factor that fits, each pixel becoming a block, so that small
images stay exact and sharp), or, for a sample without an image, its fields as text; under the
box, the sample's key, which field the box shows, and its label (``cls``, ``label`` or
``class``, with the class name when the manifest beside the shards lists classes). An image
with transparency is shown over a light checkerboard, as image editors show it, so that
transparent clip art does not turn into black squares. Tiles are laid out row by row,
COLUMNS across, each :func:`tile_size` big, with tile ``i``'s box at :func:`image_box`.

A tile shows little, so little is read for it: a JPEG is decoded at a reduced scale, an image
over the pixel limit (:mod:`wdsx.core.limits`) is not decoded at all, and of a long key or
field only what fits the tile is decoded, wrapped and measured.
"""

from __future__ import annotations

import argparse
import codecs
import io
import itertools
import math
import os
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from wdsx.commands.common import positive_int, raw_samples, shard_urls
from wdsx.core.limits import check_image_pixels, max_image_pixels
from wdsx.read.manifest import find_manifest

IMAGE_FIELDS = frozenset("jpg jpeg png ppm pgm pbm pnm bmp webp tif tiff gif".split())
"""Field extensions (their last part: ``seg.png`` counts) decoded as images."""

LABEL_FIELDS = ("cls", "label", "class")
MARGIN = 4
"""Pixels around each box and its caption."""
LINE = 12
"""Pixels per line of text."""
CAPTION_LINES = 3
CHECKER = 8
"""Side in pixels of the squares of the checkerboard behind transparent images."""
CHECKER_SHADES = (255, 204)
"""The checkerboard's two greys: light enough that no transparent pixel looks black."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("preview", help="write a PNG contact sheet of the first samples")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("-n", "--count", type=positive_int, default=16, help="samples to show (default 16)")
    parser.add_argument(
        "-o", "--output", default="preview.png", help="PNG file to write (default preview.png)"
    )
    parser.add_argument("--columns", type=int, default=None, help="tiles per row (default: a square)")
    parser.add_argument(
        "--size", type=positive_int, default=128, help="image box side in pixels (default 128)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    samples = list(itertools.islice((s for url in urls for s in raw_samples(url)), args.count))
    if not samples:
        raise ValueError("no samples in " + " ".join(args.shards))
    manifest = find_manifest(urls[0], urls)[0]
    names = list(manifest.extra.get("classes", [])) if manifest else []
    columns = args.columns or math.ceil(math.sqrt(len(samples)))
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    contact_sheet(samples, columns, args.size, names).save(args.output, format="PNG")
    print(f"{args.output}: {len(samples)} samples, {columns} per row")
    return 0


def tile_size(size: int) -> tuple[int, int]:
    """Width and height of one tile: the box, its caption and the margins."""
    return size + 2 * MARGIN, size + 3 * MARGIN + CAPTION_LINES * LINE


def image_box(index: int, columns: int, size: int) -> tuple[int, int]:
    """Left and top of tile ``index``'s SIZE x SIZE box in the sheet."""
    width, height = tile_size(size)
    row, column = divmod(index, columns)
    return column * width + MARGIN, row * height + MARGIN


def contact_sheet(
    samples: Sequence[dict[str, Any]], columns: int, size: int, names: Sequence[str] = ()
) -> Image.Image:
    """The sheet of ``samples`` (raw sample dicts: fields as bytes), ``columns`` tiles a row."""
    width, height = tile_size(size)
    rows = math.ceil(len(samples) / columns)
    sheet = Image.new("RGB", (columns * width, rows * height), "white")
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    for index, sample in enumerate(samples):
        left, top = image_box(index, columns, size)
        found = first_image(sample, size)
        if found is not None:
            field, image = found
            image = opaque(fit(image, size))
            sheet.paste(image, (left + (size - image.width) // 2, top + (size - image.height) // 2))
            shown = f"image: {field}"
        else:
            draw.rectangle((left, top, left + size - 1, top + size - 1), outline="lightgray")
            _write(draw, font, _field_lines(sample, draw, font, size), left, top, size, size // LINE)
            shown = "text of the fields"
        caption = [str(sample.get("__key__", "")), shown, _label(sample, names)]
        _write(draw, font, caption, left, top + size + MARGIN, size, CAPTION_LINES)
    return sheet


def first_image(sample: dict[str, Any], size: int | None = None) -> tuple[str, Image.Image] | None:
    """The sample's first image field and its image, decoded to RGB, or to RGBA when it has
    transparency (a JPEG at the smallest scale that still covers a ``size`` box); None when
    it has none that decodes within the limits."""
    for field, value in sample.items():
        if field.rsplit(".", 1)[-1] in IMAGE_FIELDS and isinstance(value, bytes):
            try:
                with Image.open(io.BytesIO(value)) as image:
                    if size is not None:
                        image.draft("RGB", (size, size))
                    check_image_pixels(image.height, image.width, max_image_pixels())
                    return field, image.convert("RGBA" if has_transparency(image) else "RGB")
            except (OSError, ValueError, Image.DecompressionBombError):
                continue
    return None


def has_transparency(image: Image.Image) -> bool:
    """Whether ``image`` has an alpha channel or a transparent colour (palette and grey PNGs)."""
    return "A" in image.getbands() or "transparency" in image.info


def opaque(image: Image.Image) -> Image.Image:
    """``image`` as RGB; one with an alpha channel composited over a light checkerboard."""
    if image.mode != "RGBA":
        return image.convert("RGB")
    rows, columns = np.indices((image.height, image.width)) // CHECKER
    shades = np.where((rows + columns) % 2 == 0, *CHECKER_SHADES).astype(np.uint8)
    board = Image.fromarray(np.stack([shades] * 3 + [np.full_like(shades, 255)], axis=-1))
    return Image.alpha_composite(board, image).convert("RGB")


def fit(image: Image.Image, size: int) -> Image.Image:
    """``image`` shrunk to fit a ``size`` box, or enlarged by a whole factor (nearest pixel)."""
    factor = size // max(image.width, image.height)
    if factor == 0:
        image.thumbnail((size, size))
        return image
    return image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)


def _label(sample: dict[str, Any], names: Sequence[str]) -> str:
    for field in LABEL_FIELDS:
        if field in sample:
            text = _text(sample[field], 40)
            if text.strip().isdigit() and len(text) < 20 and int(text) < len(names):
                return f"{field}: {text.strip()} {names[int(text)]}"
            return f"{field}: {text.strip()}"
    return ""


def _field_lines(sample: dict[str, Any], draw: ImageDraw.ImageDraw, font: Any, size: int) -> list[str]:
    """The sample's fields as ``name: text`` lines wrapped to the box's width."""
    per_line = max(1, int(size // max(1.0, draw.textlength("M", font=font))))
    shown = per_line * (size // LINE + 1)  # more than the box can show
    lines = []
    for field, value in sample.items():
        if not field.startswith("__"):
            lines += textwrap.wrap(f"{field[:shown]}: {_text(value, shown)}", per_line) or [f"{field}:"]
    return lines


def _text(value: Any, most: int) -> str:
    """``value`` as text, of which at most ``most`` characters are decoded; bytes that are
    not UTF-8 show as their count."""
    if isinstance(value, bytes):
        try:  # incremental: a character cut at the end is dropped, not an error
            return codecs.getincrementaldecoder("utf-8")().decode(value[: 4 * most])[:most]
        except UnicodeDecodeError:
            return f"<{len(value)} bytes>"
    return str(value)[:most]


def _write(
    draw: ImageDraw.ImageDraw, font: Any, lines: list[str], left: int, top: int, width: int, most: int
) -> None:
    """Draw up to ``most`` lines from (left, top), each cut to fit ``width`` pixels."""
    for number, line in enumerate(lines[:most]):
        draw.text((left, top + number * LINE), _fitted(draw, font, line, width), fill="black", font=font)


def _fitted(draw: ImageDraw.ImageDraw, font: Any, line: str, width: int) -> str:
    """``line``, or its longest start that fits ``width`` pixels with an ellipsis after it
    (found by bisection, measuring no more than ``width`` characters: more could only fit
    with glyphs narrower than a pixel); "" when not even the ellipsis fits."""
    if len(line) <= width and draw.textlength(line, font=font) <= width:
        return line
    low, high = -1, min(len(line), width) - 1  # the longest start that fits is in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        if draw.textlength(line[:middle] + "…", font=font) <= width:
            low = middle
        else:
            high = middle - 1
    return line[:low] + "…" if low >= 0 else ""
