"""``decode_resized``: crops at the training size, decoded at a reduced JPEG scale where that
gives enough pixels. Oracles: Pillow (full decode, or ``Image.draft`` for the reduced scale,
then its resize), and for the random crops, an uninterrupted run on one worker."""

from __future__ import annotations

import io
import json
import math
import os

import numpy as np
import PIL.Image
import pytest
import torch

import wdsx
from tests.fixtures.shards import write_tar
from wdsx.codecs import scaled
from wdsx.core import rng


def photo(seed: int, width: int, height: int) -> bytes:
    """A smooth colour image with some texture, as a JPEG."""
    generator = np.random.default_rng(seed)
    coarse = generator.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    image = np.asarray(PIL.Image.fromarray(coarse).resize((width, height), PIL.Image.Resampling.BICUBIC))
    noisy = np.clip(image + generator.normal(0, 6, image.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(noisy).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Three shards of 12 photos of assorted sizes, and the JPEG of each key."""
    directory = tmp_path_factory.mktemp("photos")
    urls, by_key = [], {}
    for shard in range(3):
        members = []
        for index in range(12):
            key = f"p{shard}/{index:02d}"
            data = photo(shard * 50 + index, 300 + 37 * index, 220 + 23 * shard)
            by_key[key] = data
            members += [(f"{key}.jpg", data), (f"{key}.cls", str(index).encode())]
        urls.append(write_tar(os.path.join(directory, f"photos-{shard}.tar"), members))
    return urls, by_key


def pillow_crop(data: bytes, box: scaled.Box, size: int, draft: int = 1) -> np.ndarray:
    """Pillow's decode (at 1/``draft`` scale through ``Image.draft``), crop and resize."""
    image = PIL.Image.open(io.BytesIO(data))
    width, height = image.size
    if draft > 1:
        image.draft("RGB", (width // draft, height // draft))
    image = image.convert("RGB")
    assert image.size == (math.ceil(width / draft), math.ceil(height / draft))
    sx, sy = image.width / width, image.height / height
    region = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
    return np.asarray(image.resize((size, size), PIL.Image.Resampling.BILINEAR, box=region))


def test_full_size_decoding_is_pillows_crop_and_resize(photos):
    urls, by_key = photos
    dataset = wdsx.WebDataset(urls).decode_resized(64, crop="center", scaled_decoding=False)
    for sample in dataset:
        data = by_key[sample["__key__"]]
        height, width = scaled.image_size(data)
        box = scaled.center_box(height, width, 64, 64)
        assert sample["jpg"].shape == (64, 64, 3) and sample["cls"] == int(sample["__key__"][-2:])
        assert np.array_equal(sample["jpg"], pillow_crop(data, box, 64))


def test_scaled_decoding_is_pillows_draft_then_resize(photos):
    urls, by_key = photos
    dataset = wdsx.WebDataset(urls).decode_resized(48, crop="none")
    reduced = 0
    for sample in dataset:
        data = by_key[sample["__key__"]]
        height, width = scaled.image_size(data)
        box = scaled.Box(0, 0, height, width)
        factor = scaled.reduction(box, 48, 48, 1.0)
        reduced += factor > 1
        assert np.array_equal(sample["jpg"], pillow_crop(data, box, 48, draft=factor))
    assert reduced == 36  # every image is more than twice the output's size


def test_random_boxes_follow_randomresizedcrop():
    for seed in range(300):
        box = scaled.random_resized_box(seed, 375, 500, (0.08, 1.0), (3 / 4, 4 / 3))
        assert 0 <= box.top and box.top + box.height <= 375 and 0 <= box.left and box.left + box.width <= 500
        assert 0.08 * 0.9 <= box.height * box.width / (375 * 500) <= 1.0
        assert 3 / 4 * 0.95 <= box.width / box.height <= 4 / 3 * 1.05
    # nothing fits a very wide ratio on a square image: the central box of the nearest ratio
    assert scaled.random_resized_box(1, 100, 100, (0.9, 1.0), (3.0, 4.0)) == scaled.Box(33, 0, 33, 100)


def crops(loader) -> dict[str, np.ndarray]:
    return {key: image for images, keys in loader for image, key in zip(images, keys)}


def build(urls, workers: int, epoch_draws: bool = True):
    dataset = (
        wdsx.WebDataset(urls, shardshuffle=True)
        .shuffle(10)
        .decode_resized(32, flip=True, spec="torchrgb8")
        .to_tuple("jpg", "__key__")
        .batched(4)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def test_random_crops_depend_on_the_sample_and_epoch_only(photos):
    urls, _ = photos
    one = build(urls, 1)
    first_epoch, second_epoch = crops(one), crops(one)
    assert first_epoch.keys() == second_epoch.keys() and len(first_epoch) == 36
    image = next(iter(first_epoch.values()))
    assert isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.shape == (3, 32, 32)
    assert sum(not torch.equal(first_epoch[k], second_epoch[k]) for k in first_epoch) > 30
    two = crops(build(urls, 2))
    assert all(torch.equal(two[k], first_epoch[k]) for k in first_epoch)


def test_random_crops_survive_a_resume(photos):
    urls, _ = photos
    full = crops(build(urls, 2))
    first = build(urls, 2)
    batches = iter(first)
    before = [next(batches) for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = build(urls, 2)
    second.load_state_dict(state)
    resumed = {**crops(before), **crops(second)}
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_flips_are_drawn_per_sample(photos):
    urls, by_key = photos
    flipped = 0
    for sample in wdsx.WebDataset(urls).decode_resized(40, crop="center", flip=True, scaled_decoding=False):
        data = by_key[sample["__key__"]]
        height, width = scaled.image_size(data)
        plain = pillow_crop(data, scaled.center_box(height, width, 40, 40), 40)
        seed = rng.derive_seed("flip", wdsx.core.sampleseed.sample_seed(sample))
        mirrored = rng.uniform(seed, 0) < 0.5
        flipped += mirrored
        assert np.array_equal(sample["jpg"], plain[:, ::-1] if mirrored else plain)
    assert 5 < flipped < 31


def test_non_rgb_specs_are_refused():
    with pytest.raises(ValueError, match="RGB"):
        wdsx.decode_resized(32, spec="l8")
