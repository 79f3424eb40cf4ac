"""Colour image shards for the WebLoader benchmarks, generated once under ``bench-out/``.

* ``clipart``: the tutorial's data: the 8,118 PNGs of Debian's ``openclipart-png`` package that
  Pillow opens (real colour drawings of all sizes; ``make bench`` installs the package where
  apt-get can), converted to an RGB JPEG ``input.jpg`` with a ``target.pt`` class tensor (its
  folder). Without the package,
  photo-like images of the same count and a spread of sizes stand in for them.
* ``photo``: an ImageNet-like set: 500x375 photo-like JPEGs of about 100 KB (smooth shading,
  texture and sensor noise, which is what makes real photos cost what they cost to decode).
"""

from __future__ import annotations

import glob
import io
import os

import numpy as np
import PIL.Image

from benchmarks.data import _shard_set

CLIPART = "/usr/share/openclipart/png"
LONGEST = 2048
"""A few drawings are up to 13,000 pixels square (half the pixels of the whole set are in 20
of them); like most datasets, the shards store them at most this large."""


def photo(rng: np.random.Generator, width: int = 500, height: int = 375) -> np.ndarray:
    """A photo-like RGB image: smooth colour fields, mid-scale texture and noise."""

    def field(rows: int, columns: int) -> np.ndarray:
        values = rng.normal(0, 1, (rows, columns, 3))
        scaled = ((values - values.min()) / np.ptp(values) * 255).astype(np.uint8)
        return np.asarray(PIL.Image.fromarray(scaled).resize((width, height), PIL.Image.BICUBIC), float)

    image = field(6, 8) + 0.16 * field(48, 64) + rng.normal(0, 9, (height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def jpeg(image: np.ndarray | PIL.Image.Image, quality: int) -> bytes:
    out = io.BytesIO()
    picture = image if isinstance(image, PIL.Image.Image) else PIL.Image.fromarray(image)
    picture.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def _target(label: int) -> bytes:
    import torch

    out = io.BytesIO()
    torch.save(torch.tensor(label), out)
    return out.getvalue()


def _usable(path: str) -> bool:
    """Pillow refuses a few giant drawings as possible decompression bombs."""
    try:
        with PIL.Image.open(path):
            return True
    except (PIL.Image.DecompressionBombError, OSError):
        return False


def _flattened(path: str) -> PIL.Image.Image:
    """A drawing on a white background, as RGB, at most ``LONGEST`` pixels on its long side."""
    image = PIL.Image.open(path).convert("RGBA")
    image.thumbnail((LONGEST, LONGEST))
    background = PIL.Image.new("RGBA", image.size, (255, 255, 255, 255))
    return PIL.Image.alpha_composite(background, image).convert("RGB")


def clipart_shards(nshards: int = 8, quality: int = 90) -> list[str]:
    """The tutorial's shards: ``input.jpg`` and ``target.pt`` per drawing."""
    found = sorted(glob.glob(os.path.join(CLIPART, "**", "*.png"), recursive=True))
    files = [path for path in found if _usable(path)]
    name = "clipart" if files else "clipart-standin"
    count = len(files) or 8000
    folders = sorted({os.path.relpath(path, CLIPART).split(os.sep)[0] for path in files}) or ["photo"]
    rng = np.random.default_rng(4)

    def fields(index: int) -> list[tuple[str, bytes]]:
        if files:
            path = files[index]
            label = folders.index(os.path.relpath(path, CLIPART).split(os.sep)[0])
            image: np.ndarray | PIL.Image.Image = _flattened(path)
        else:
            label = 0
            image = photo(rng, int(rng.integers(100, 800)), int(rng.integers(100, 800)))
        return [("input.jpg", jpeg(image, quality)), ("target.pt", _target(label))]

    per_shard = -(-count // nshards)
    paths = _shard_set(name, nshards, per_shard, lambda i: fields(i) if i < count else [])
    return paths


def photo_shards(samples: int = 4000, nshards: int = 8, pool: int = 200, quality: int = 95) -> list[str]:
    """ImageNet-like shards: ``jpg`` (500x375, about 100 KB) and ``cls``."""
    rng = np.random.default_rng(5)
    images: list[bytes] = []

    def fields(index: int) -> list[tuple[str, bytes]]:
        if not images:
            images.extend(jpeg(photo(rng), quality) for _ in range(pool))
        return [("cls", b"%d" % (index % 1000)), ("jpg", images[index % pool])]

    return _shard_set("photo", nshards, samples // nshards, fields)
