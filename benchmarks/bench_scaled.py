"""How scaled decoding's pixels differ from decoding at full size, and how much it saves.

For every image, the same box is cut and resized to 224x224 from the image decoded at full
size and from the image decoded at the reduced scale ``decode_resized`` picks; the mean
absolute difference (in 0-255 levels, over all pixels and channels) is reported over the
images that were decoded at a reduced scale (the others are identical by construction),
with the decoding and resizing time of both ways.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import numpy as np

from benchmarks import bound
from wdsx.codecs import scaled
from wdsx.core import rng

SIZE = 224


def _boxes(payloads: Sequence[bytes], crop: str) -> list[tuple[tuple[int, int], scaled.Box]]:
    result = []
    for number, data in enumerate(payloads):
        height, width = scaled.image_size(data)
        if crop == "random":
            box = scaled.random_resized_box(
                rng.derive_seed("bench", number), height, width, (0.08, 1.0), (0.75, 4 / 3)
            )
        else:
            box = scaled.center_box(height, width, SIZE, SIZE)
        result.append(((height, width), box))
    return result


def compare(payloads: Sequence[bytes], crop: str, floor: float) -> dict[str, float]:
    """Share of images decoded at a reduced scale, their mean absolute difference, and the
    milliseconds per image of full-size and scaled decoding (crop and resize included)."""
    boxes = _boxes(payloads, crop)
    differences, reduced = [], 0
    times = {"full": 0.0, "scaled": 0.0}
    for data, (size, box) in zip(payloads, boxes):
        began = time.process_time()
        full = scaled.resized_crop(data, size, box, SIZE, SIZE, floor=0)
        middle = time.process_time()
        small = scaled.resized_crop(data, size, box, SIZE, SIZE, floor=floor)
        times["full"] += middle - began
        times["scaled"] += time.process_time() - middle
        if scaled.reduction(box, SIZE, SIZE, floor) > 1:
            reduced += 1
            differences.append(float(np.abs(full.astype(np.int16) - small.astype(np.int16)).mean()))
    return {
        "reduced": reduced / len(payloads),
        "mad": statistics.mean(differences) if differences else 0.0,
        "full_ms": 1000 * times["full"] / len(payloads),
        "scaled_ms": 1000 * times["scaled"] / len(payloads),
    }


def decode_by_scale(payloads: Sequence[bytes]) -> dict[int, float]:
    """Milliseconds of CPU per image to decode ``payloads`` at 1/1, 1/2, 1/4 and 1/8 of their
    size (medians of three passes): how much of a JPEG's decoding any scale can save."""
    result = {}
    for factor in (1, 2, 4, 8):
        passes = []
        for _ in range(3):
            began = time.process_time()
            for data in payloads:
                height, width = scaled.image_size(data)
                scaled.decode_reduced(data, factor, height, width)
            passes.append(1000 * (time.process_time() - began) / len(payloads))
        result[factor] = statistics.median(passes)
    return result


def scaled_rows() -> list[tuple[str, str, str, str, str]]:
    from benchmarks import images

    generator = np.random.default_rng(6)
    sets = {
        "clipart (real drawings)": bound.field_bytes(images.clipart_shards()[:2], "input.jpg"),
        "ImageNet-like 500x375": bound.field_bytes(images.photo_shards()[:1], "jpg"),
        "photo-like 1600x1200": [images.jpeg(images.photo(generator, 1600, 1200), 90) for _ in range(40)],
    }
    by_scale = decode_by_scale(sets["ImageNet-like 500x375"])
    rows = [
        (
            "decode time by scale, ImageNet-like 500x375 JPEGs (1/1, 1/2, 1/4, 1/8)",
            " / ".join(f"{by_scale[factor]:.3f}" for factor in (1, 2, 4, 8)) + " ms/image",
            "",
            f"1/8 costs {by_scale[8] / by_scale[1]:.2f} of full size: entropy decoding dominates",
            "",
        )
    ]
    for name, payloads in sets.items():
        for crop in ("center", "random"):
            for floor in (1.0, 0.5):
                found = compare(payloads, crop, floor)
                share = f"{100 * found['reduced']:.0f}% decoded smaller"
                rows.append(
                    (
                        f"scaled decoding, {name}, {crop} crop to {SIZE}, scaled_decoding={floor:g}",
                        f"{found['scaled_ms']:.3f} ms/image",
                        f"full size {found['full_ms']:.3f} ms/image",
                        f"{share}; mean abs. difference {found['mad']:.2f}",
                        "",
                    )
                )
    return rows
