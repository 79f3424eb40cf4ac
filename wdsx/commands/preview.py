"""``wdsx preview``: a PNG contact sheet of a dataset's first samples, for a person to look at.

Each sample gets one tile: its first image field, centred in a SIZE x SIZE box (shrunk to fit,
or enlarged by the largest whole factor that fits, each pixel becoming a block, so that small
images stay exact and sharp), or, for a sample without an image, its fields as text; under the
box, the sample's key and its label (``cls``, ``label`` or ``class``, with the class name when
the manifest beside the shards lists classes). Tiles are laid out row by row, COLUMNS across,
each :func:`tile_size` big, with tile ``i``'s box at :func:`image_box`.
"""

from __future__ import annotations

import argparse
import io
import itertools
import math
import textwrap
from collections.abc import Sequence
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from wdsx.commands.common import raw_samples, shard_urls
from wdsx.read.manifest import Manifest, manifest_url_beside

IMAGE_FIELDS = frozenset("jpg jpeg png ppm pgm pbm pnm bmp webp tif tiff gif".split())
"""Field extensions (their last part: ``seg.png`` counts) decoded as images."""

LABEL_FIELDS = ("cls", "label", "class")
MARGIN = 4
"""Pixels around each box and its caption."""
LINE = 12
"""Pixels per line of text."""
CAPTION_LINES = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("preview", help="write a PNG contact sheet of the first samples")
    parser.add_argument("shards", nargs="+", help="shard URLs or patterns")
    parser.add_argument("-n", "--count", type=int, default=16, help="samples to show (default 16)")
    parser.add_argument("-o", "--output", default="preview.png", help="PNG file to write")
    parser.add_argument("--columns", type=int, default=None, help="tiles per row (default: a square)")
    parser.add_argument("--size", type=int, default=128, help="image box side in pixels (default 128)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    urls = shard_urls(args.shards)
    samples = list(itertools.islice((s for url in urls for s in raw_samples(url)), args.count))
    if not samples:
        raise ValueError("no samples in " + " ".join(args.shards))
    beside = manifest_url_beside(urls[0])
    manifest = Manifest.load(beside) if beside else None
    names = list(manifest.extra.get("classes", [])) if manifest else []
    columns = args.columns or math.ceil(math.sqrt(len(samples)))
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
        image = first_image(sample)
        if image is not None:
            image = fit(image, size)
            sheet.paste(image, (left + (size - image.width) // 2, top + (size - image.height) // 2))
        else:
            draw.rectangle((left, top, left + size - 1, top + size - 1), outline="lightgray")
            _write(draw, font, _field_lines(sample, draw, font, size), left, top, size, size // LINE)
        caption = [str(sample.get("__key__", "")), _label(sample, names)]
        _write(draw, font, caption, left, top + size + MARGIN, size, CAPTION_LINES)
    return sheet


def first_image(sample: dict[str, Any]) -> Image.Image | None:
    """The sample's first image field, decoded to RGB; None when it has none that decodes."""
    for field, value in sample.items():
        if field.rsplit(".", 1)[-1] in IMAGE_FIELDS and isinstance(value, bytes):
            try:
                with Image.open(io.BytesIO(value)) as image:
                    return image.convert("RGB")
            except OSError:
                continue
    return None


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
            text = _text(sample[field])
            if text.strip().isdigit() and int(text) < len(names):
                return f"{field}: {text.strip()} {names[int(text)]}"
            return f"{field}: {text.strip()}"
    return ""


def _field_lines(sample: dict[str, Any], draw: ImageDraw.ImageDraw, font: Any, size: int) -> list[str]:
    """The sample's fields as ``name: text`` lines wrapped to the box's width."""
    per_line = max(1, int(size // max(1.0, draw.textlength("M", font=font))))
    lines = []
    for field, value in sample.items():
        if not field.startswith("__"):
            lines += textwrap.wrap(f"{field}: {_text(value)}", per_line) or [f"{field}:"]
    return lines


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return f"<{len(value)} bytes>"
    return str(value)


def _write(
    draw: ImageDraw.ImageDraw, font: Any, lines: list[str], left: int, top: int, width: int, most: int
) -> None:
    """Draw up to ``most`` lines from (left, top), each cut to fit ``width`` pixels."""
    for number, line in enumerate(lines[:most]):
        while line and draw.textlength(line, font=font) > width:
            line = line[:-2] + "…" if len(line) > 1 else ""
        draw.text((left, top + number * LINE), line, fill="black", font=font)
