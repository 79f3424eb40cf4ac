"""Batches of items with large arrays or tensors, collated while they fill, against webdataset's
collation of the same items held until the batch is full."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.stages.filling import Filling

BIG = (2, 128, 128)
"""float32 of this shape is large enough to be collated while the batch fills."""

VARIANTS = (
    "array of another shape",
    "float64 array",
    "tensor in the array column",
    "array in the tensor column",
    "tensor that needs grad",
    "float64 tensor",
    "one field fewer",
    "an int for the array",
)


def item(index: int, variant: str | None, as_dict: bool) -> Any:
    """Item ``index``: a large array, a large tensor, an int and a string; ``variant`` changes
    one of them as named."""
    fields: list[Any] = [np.full(BIG, index, np.float32), torch.full(BIG, float(index)), index, f"k{index}"]
    if variant == "array of another shape":
        fields[0] = fields[0][:, :, :64]
    elif variant == "float64 array":
        fields[0] = fields[0].astype(np.float64)
    elif variant == "tensor in the array column":
        fields[0] = torch.from_numpy(fields[0])
    elif variant == "array in the tensor column":
        fields[1] = fields[1].numpy()
    elif variant == "tensor that needs grad":
        fields[1] = fields[1].requires_grad_()
    elif variant == "float64 tensor":
        fields[1] = fields[1].double()
    elif variant == "one field fewer":
        fields = fields[:3]
    elif variant == "an int for the array":
        fields[0] = index
    return dict(zip("abcd", fields)) if as_dict else tuple(fields)


def assert_same(got: Any, expected: Any) -> None:
    assert type(got) is type(expected)
    if isinstance(expected, dict):
        assert set(got) == set(expected)
        for key in expected:
            assert_same(got[key], expected[key])
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for one, other in zip(got, expected):
            assert_same(one, other)
    elif isinstance(expected, np.ndarray):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert np.array_equal(got, expected)
    elif isinstance(expected, torch.Tensor):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.requires_grad == expected.requires_grad and got.stride() == expected.stride()
        assert torch.equal(got.detach(), expected.detach())
    else:
        assert got == expected


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 5),
    st.lists(st.one_of(st.none(), st.none(), st.sampled_from(VARIANTS)), min_size=1, max_size=12),
    st.booleans(),
    st.booleans(),
)
@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_batches_equal_webdatasets_collation_of_the_held_items(size, variants, as_dict, partial):
    items = [item(index, variant, as_dict) for index, variant in enumerate(variants)]
    assert Filling.start(item(0, None, as_dict), size) is not None  # such batches are filled
    expected, failure = [], False
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        if len(chunk) < size and not partial:
            break
        try:
            expected.append(wds.filters.default_collation_fn(chunk))
        except (AssertionError, AttributeError, ValueError, RuntimeError, TypeError):
            failure = True
            break
    got = iter(wdsx.DataPipeline(lambda: iter(items), wdsx.batched(size, partial=partial)))
    for batch in expected:
        assert_same(next(got), batch)
    if failure:
        with pytest.raises((AttributeError, ValueError, RuntimeError, TypeError)):
            next(got)
    else:
        assert next(got, None) is None


@pytest.mark.parametrize(
    ("make", "size"),
    [
        (lambda index: np.full((128, 128), index, ">f4"), 3),  # np.array makes the byte order native
        (lambda index: torch.full((1, 3, 128, 128), float(index)).to(memory_format=torch.channels_last), 3),
        (lambda index: np.full((256, 256), index, np.float32), 10**6),  # a batch too large to allocate whole
    ],
    ids=["big-endian", "channels-last", "huge-batch-size"],
)
def test_values_whose_stack_is_not_a_plain_copy(make, size):
    items = [(make(index), index) for index in range(3)]
    (batch,) = wdsx.DataPipeline(lambda: iter(items), wdsx.batched(size))
    assert_same(batch, wds.filters.default_collation_fn(items))


def transform(sample: dict) -> tuple:
    """A user transform that makes large arrays per sample, as image transforms do; the sample's
    number (shard x 100 + index) in every one."""
    key = sample["__key__"]
    number = 100 * int(key[1:4]) + int(key[5:])
    channels_last = torch.full((1, *BIG), float(number)).to(memory_format=torch.channels_last)
    return torch.full(BIG, float(number)), np.full((64, 256), number, np.float32), number, channels_last


def test_a_webloader_sends_the_batches_webdataset_sends(tmp_path):
    urls = make_shards(str(tmp_path), [7, 6]).urls  # a shard per worker, in both libraries

    def loader(module):
        dataset = module.WebDataset(urls, shardshuffle=False).map(transform).batched(4)
        return module.WebLoader(dataset, batch_size=None, num_workers=2)

    def first(batch: Any) -> int:
        return int(batch[2][0])

    got, expected = sorted(loader(wdsx), key=first), sorted(loader(wds), key=first)
    assert [first(batch) for batch in got] == [first(batch) for batch in expected]
    for one, other in zip(got, expected):
        assert_same(tuple(one), tuple(other))
