"""The small dataset every client reads: tar shards built with Python's tarfile.

Each sample has the fields the clients look for: ``jpg`` (a JPEG whose colour encodes the
sample), ``txt`` (a caption naming the sample), ``json`` (the caption and a label) and ``cls``
(the label). Training shards all hold ``TRAIN_PER_SHARD`` samples, so however a program deals
them to its workers, every worker's share is a whole number of batches of ``BATCH_SIZE``; the
validation shards have uneven sizes, so partial batches and uneven shares show.
"""

from __future__ import annotations

import io
import json
import os

import PIL.Image

from tests.fixtures.shards import write_tar

TRAIN_SHARDS = 8
TRAIN_PER_SHARD = 4
VALIDATION_COUNTS = (3, 4, 2, 5)
BATCH_SIZE = 4
TRAIN_SAMPLES = TRAIN_SHARDS * TRAIN_PER_SHARD


def train_pattern(directory: str) -> str:
    """The training shards in brace notation."""
    return os.path.join(directory, f"train-{{0000..{TRAIN_SHARDS - 1:04d}}}.tar")


def validation_pattern(directory: str) -> str:
    """The validation shards in brace notation."""
    return os.path.join(directory, f"val-{{0000..{len(VALIDATION_COUNTS) - 1:04d}}}.tar")


def caption(key: str) -> str:
    return f"a photo of sample {key}"


def colour(index: int) -> tuple[int, int, int]:
    """The colour of sample ``index``'s image: it tells the samples apart after decoding."""
    return (index * 37 % 256, index * 91 % 256, index * 53 % 256)


def _jpeg(index: int) -> bytes:
    image = PIL.Image.new("RGB", (20, 16), colour(index))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def _members(key: str, index: int) -> list[tuple[str, bytes]]:
    label = index % 5
    return [
        (f"{key}.jpg", _jpeg(index)),
        (f"{key}.txt", caption(key).encode()),
        (f"{key}.json", json.dumps({"caption": caption(key), "label": label}).encode()),
        (f"{key}.cls", str(label).encode()),
    ]


def _layout() -> dict[str, list[str]]:
    """Each shard's file name and the keys of its samples, in order."""
    splits = [("train", [TRAIN_PER_SHARD] * TRAIN_SHARDS), ("val", list(VALIDATION_COUNTS))]
    return {
        f"{split}-{shard:04d}.tar": [f"{split}{shard:02d}-{position:02d}" for position in range(count)]
        for split, counts in splits
        for shard, count in enumerate(counts)
    }


KEYS = [key for keys in _layout().values() for key in keys]
"""Every sample's key; a sample's place in this list is the index that picks its colour."""


def write_dataset(directory: str) -> None:
    """Write the training and validation shards into ``directory``."""
    index = 0
    for name, keys in _layout().items():
        members = []
        for key in keys:
            members += _members(key, index)
            index += 1
        write_tar(os.path.join(directory, name), members)
