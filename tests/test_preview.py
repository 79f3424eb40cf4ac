"""``wdsx preview``: the contact sheet, read back as a PNG: its size, and each tile's pixels
against the sample's image decoded by Pillow."""

from __future__ import annotations

import io

import numpy as np
import PIL.Image

from wdsx.commands import cli
from wdsx.commands.preview import image_box, tile_size
from wdsx.write.writer import ShardWriter


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_each_tile_is_the_decoded_sample_with_its_caption(tmp_path):
    generator = np.random.default_rng(0)
    images = [generator.integers(0, 256, (28, 28, 3), dtype=np.uint8) for _ in range(4)]
    images.append(generator.integers(0, 256, (28, 28), dtype=np.uint8))  # grey
    pattern = str(tmp_path / "set-%06d.tar")
    with ShardWriter(pattern, maxcount=3, metadata={"classes": ["cat", "dog"]}) as sink:
        for i, pixels in enumerate(images + images):
            sink.write({"__key__": f"k{i}", "png": png(pixels), "cls": i % 2})
    output = str(tmp_path / "sheet.png")

    shards = str(tmp_path / "set-{000000..000003}.tar")
    assert cli.main(["preview", shards, "-n", "5", "-o", output, "--columns", "3", "--size", "56"]) == 0

    sheet = np.asarray(PIL.Image.open(output).convert("RGB"))
    width, height = tile_size(56)
    assert sheet.shape == (2 * height, 3 * width, 3)
    for index, pixels in enumerate(images):
        left, top = image_box(index, 3, 56)
        tile = sheet[top : top + 56, left : left + 56]
        decoded = np.asarray(PIL.Image.open(io.BytesIO(png(pixels))).convert("RGB"))
        for dy in (0, 1):  # 28 x 28 enlarged twice: every pixel a 2 x 2 block
            for dx in (0, 1):
                assert np.array_equal(tile[dy::2, dx::2], decoded), index
        caption = sheet[top + 56 : top + height - 4, left : left + 56]
        assert (caption < 128).any(), "the key and label are written under the image"
    left, top = image_box(5, 3, 56)
    assert (sheet[top - 4 :, left - 4 :] == 255).all(), "tiles past the last sample stay blank"


def test_samples_without_images_show_their_text(shards, tmp_path):
    output = str(tmp_path / "text.png")
    assert cli.main(["preview", shards.urls[0], "-n", "4", "-o", output, "--size", "64"]) == 0
    sheet = np.asarray(PIL.Image.open(output).convert("L"))
    width, height = tile_size(64)
    assert sheet.shape == (2 * height, 2 * width)
    for index in range(4):
        left, top = image_box(index, 2, 64)
        assert (sheet[top + 2 : top + 62, left + 2 : left + 62] < 128).any(), index
