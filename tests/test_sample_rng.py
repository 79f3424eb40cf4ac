"""Per-sample randomness: ``wdsx.sample_rng`` depends on (seed, epoch, key, padding) only, so an
augmentation drawn from it is bit-identical on any number of workers and after a resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import wdsx
from wdsx.core.sampleseed import EPOCH_SEED, epoch_seed, sample_seed
from wdsx.state.position import Position


def sample(key: str = "a/1", seed: int = 0, epoch: int = 0, pad: bool = False) -> dict:
    made = {"__key__": key, EPOCH_SEED: epoch_seed(seed, epoch), "__position__": Position("u", 0, 0, pad)}
    return {**made, "__pad__": True} if pad else made


def test_the_seed_is_a_function_of_seed_epoch_key_and_padding():
    assert sample_seed(sample()) == sample_seed(dict(sample(), txt=b"other fields do not count"))
    variants = [sample("a/2"), sample(seed=1), sample(epoch=1), sample(pad=True)]
    assert len({sample_seed(s) for s in [sample(), *variants]}) == 5


def test_numpy_and_torch_generators_repeat_per_sample():
    a, b = wdsx.sample_rng(sample()), wdsx.sample_rng(sample())
    assert np.array_equal(a.integers(0, 1 << 30, 8), b.integers(0, 1 << 30, 8))
    x = torch.rand(8, generator=wdsx.sample_rng(sample(), kind="torch"))
    assert torch.equal(x, torch.rand(8, generator=wdsx.sample_rng(sample(), kind="torch")))
    assert not torch.equal(x, torch.rand(8, generator=wdsx.sample_rng(sample(epoch=1), kind="torch")))


def test_what_the_seed_needs_is_asked_for():
    with pytest.raises(TypeError, match="before to_tuple"):
        wdsx.sample_rng(("png", 3))  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="__epoch_seed__"):
        wdsx.sample_rng({"__key__": "a"})
    with pytest.raises(ValueError, match="epoch cannot be known"):
        wdsx.sample_rng({"__key__": "a", EPOCH_SEED: None})
    with pytest.raises(ValueError, match="kind"):
        wdsx.sample_rng(sample(), kind="jax")  # type: ignore[call-overload]


def augment(item: dict) -> dict:
    """A crop offset from NumPy and a flip from torch, both drawn per sample."""
    crop = wdsx.sample_rng(item).integers(0, 1000, 2)
    flip = torch.rand(3, generator=wdsx.sample_rng(item, kind="torch"))
    return {**item, "aug": np.concatenate([crop, flip.numpy().view(np.int32)]).astype(np.int64)}


def make_loader(pattern: str, workers: int) -> wdsx.WebLoader:
    """Augmentation before a worker shuffle buffer (replayed when a worker restores it) and
    before a main-process buffer (replayed by the loader when it restores that one)."""
    dataset = (
        wdsx.WebDataset(pattern, shardshuffle=True, seed=3)
        .map(augment)
        .shuffle(15)
        .to_tuple("__key__", "aug")
        .batched(4)
    )
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
    return loader.unbatched().shuffle(10).batched(4)


def augmentations(batches: list) -> dict[str, bytes]:
    return {key: aug.numpy().tobytes() for keys, augs in batches for key, aug in zip(keys, augs)}


def test_augmentation_is_bit_identical_on_0_workers_and_on_3_workers_killed_and_resumed(shards):
    uninterrupted = make_loader(shards.pattern, 0)
    expected = [augmentations(list(uninterrupted)) for _ in range(2)]

    first = make_loader(shards.pattern, 3)
    batches = iter(first)
    before = [next(batches) for _ in range(7)]
    saved = json.dumps(first.state_dict())  # buffers in the workers and the main process are full
    del first, batches  # the process dies
    resumed = make_loader(shards.pattern, 3)
    resumed.load_state_dict(json.loads(saved))
    epoch0 = augmentations(before + list(resumed))
    epoch1 = augmentations(list(resumed))

    assert epoch0 == expected[0] and epoch1 == expected[1]
    assert sorted(epoch0) == sorted(shards.keys)
    changed = sum(epoch0[key] != epoch1[key] for key in shards.keys)
    assert changed == len(shards.keys)  # each epoch draws anew
