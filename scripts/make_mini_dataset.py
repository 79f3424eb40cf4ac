#!/usr/bin/env python3
"""Write a deterministic Fashion-MNIST subset as an image folder: ``OUT/<class>/<index>.png``.

The source is Debian's ``dataset-fashion-mnist`` package (``/usr/share/datasets/fashion-mnist``,
MIT licensed). The first ``--per-class`` images of each class, in the split's order, are
written as 8-bit grayscale PNGs named by their index in the split, so the same command always
writes the same bytes. ``data/fashion-mnist-mini`` in this repository is::

    python scripts/make_mini_dataset.py data/fashion-mnist-mini --split test --per-class 200
"""

from __future__ import annotations

import argparse
import gzip
import os
import struct
from collections.abc import Iterator

import numpy as np
from PIL import Image

SOURCE_DIR = "/usr/share/datasets/fashion-mnist"
CLASS_NAMES = (
    "T-shirt_top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle_boot",
)
"""Folder names for labels 0-9 (Fashion-MNIST's names, ``/`` and spaces replaced by ``_``)."""

_SPLIT_PREFIX = {"train": "train", "test": "t10k"}


def read_idx(path: str) -> np.ndarray:
    """An idx-ubyte file (the MNIST format) as a uint8 array of its declared shape."""
    with gzip.open(path, "rb") as file:
        data = file.read()
    zeros, dtype, dims = struct.unpack(">HBB", data[:4])
    if zeros != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte idx file")
    shape = struct.unpack(f">{dims}I", data[4 : 4 + 4 * dims])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def select(labels: np.ndarray, per_class: int) -> Iterator[int]:
    """Indices of the first ``per_class`` images of every class, in split order."""
    taken = dict.fromkeys(range(len(CLASS_NAMES)), 0)
    for index, label in enumerate(labels.tolist()):
        if taken[label] < per_class:
            taken[label] += 1
            yield index


def write_subset(out: str, split: str = "test", per_class: int = 200, source: str = SOURCE_DIR) -> int:
    """Write the subset under ``out``; returns the number of images written."""
    prefix = os.path.join(source, _SPLIT_PREFIX[split])
    images = read_idx(f"{prefix}-images-idx3-ubyte.gz")
    labels = read_idx(f"{prefix}-labels-idx1-ubyte.gz")
    for name in CLASS_NAMES:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    written = 0
    for index in select(labels, per_class):
        path = os.path.join(out, CLASS_NAMES[labels[index]], f"{index:05d}.png")
        Image.fromarray(images[index]).save(path, format="PNG", optimize=True)
        written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="output folder")
    parser.add_argument("--split", choices=sorted(_SPLIT_PREFIX), default="test")
    parser.add_argument("--per-class", type=int, default=200, help="images per class")
    parser.add_argument("--source", default=SOURCE_DIR, help="folder with the idx-ubyte .gz files")
    args = parser.parse_args()
    count = write_subset(args.out, args.split, args.per_class, args.source)
    print(f"wrote {count} images to {args.out}")


if __name__ == "__main__":
    main()
