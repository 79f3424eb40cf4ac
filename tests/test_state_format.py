"""The compact encoding of buffered sample positions in a checkpoint: it gives back exactly the
rows it was given, stays small for a real shuffle buffer, and refuses damaged text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsx
from wdsx.errors import StateError
from wdsx.state.position import pack_positions, unpack_positions

rows = st.lists(
    st.tuples(
        st.integers(0, 300),
        st.integers(0, 2**62),
        st.integers(0, 2**40),
        st.integers(0, 1),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(rows)
def test_positions_come_back_exactly_in_their_order(given_rows):
    packed = pack_positions(given_rows)
    assert json.loads(json.dumps(packed)) == packed
    assert unpack_positions(packed) == given_rows


def test_a_shuffle_buffer_costs_a_few_bytes_per_sample(uneven_shards):
    dataset = wdsx.WebDataset(uneven_shards.urls, shardshuffle=True, manifest=False).shuffle(100)
    iterator = iter(dataset)
    for _ in range(150):
        next(iterator)
    packed = dataset.state_dict()["stages"]["shuffle"]["positions"]
    held = unpack_positions(packed)
    assert len(held) >= 99
    assert len(packed) < 8 * len(held) < len(json.dumps(held)) / 2


@pytest.mark.parametrize("damage", ["", "12", "3:11111:AAAA", "2:11111:" + "eJwDAAAAAAE=", "x:1:y"])
def test_damaged_positions_are_refused(damage):
    with pytest.raises(StateError, match="corrupt buffer positions"):
        unpack_positions(damage)
