"""The compact encoding of buffered sample positions in a checkpoint: it gives back exactly the
rows it was given, stays small for a real shuffle buffer, and refuses damaged text."""

from __future__ import annotations

import json
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wdsx
from wdsx.errors import StateError
from wdsx.state.position import (
    PackedPositions,
    Position,
    PositionTable,
    as_json,
    pack_positions,
    unpack_positions,
)

rows = st.lists(
    st.tuples(
        st.integers(0, 300),
        st.integers(0, 2**62),
        st.integers(0, 2**40),
        st.integers(0, 1),
    ),
    max_size=200,
)


@pytest.mark.slow
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


def random_positions(generator: random.Random, count: int) -> list[Position]:
    urls = ["a.tar", "b.tar", "s3://bucket/c.tar"]
    return [
        Position(
            generator.choice(urls),
            generator.randrange(2**40),
            generator.randrange(2**20),
            generator.random() < 0.1,
        )
        for _ in range(count)
    ]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32),
    st.integers(256, 400),
    st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), max_size=80),
)
def test_a_buffer_encoded_again_after_changes_equals_a_fresh_encoding(seed, size, changes):
    """A table remembers a large list between encodings; what it writes after the list
    changed must be what a table that never saw it writes."""
    generator = random.Random(seed)
    held = random_positions(generator, size)
    table = PositionTable()
    table.encode(held)
    for where, swap in changes:  # the moves of a shuffle buffer: swap with the last, pop, append
        if swap and held:
            k = where % len(held)
            held[k], held[-1] = held[-1], held[k]
            held.pop()
        held += random_positions(generator, 1)
    again = table.encode(held)
    fresh = PositionTable()
    assert fresh.decode(fresh.encode(held)) == table.decode(again) == held


def test_deferred_positions_pack_to_the_text_an_eager_table_writes():
    held = [Position(f"s{i % 3}.tar", 1000 * i, i, i % 7 == 0) for i in range(500)]
    eager, deferred = PositionTable(), PositionTable(deferred=True)
    lazy = deferred.encode(held)
    assert isinstance(lazy, PackedPositions)
    assert as_json({"stages": {"shuffle": {"positions": lazy}}, "states": [lazy]}) == {
        "stages": {"shuffle": {"positions": eager.encode(held)}},
        "states": [eager.encode(held)],
    }
    assert deferred.decode(pickle.loads(pickle.dumps(lazy))) == held


def test_a_loader_state_is_plain_json(uneven_shards):
    dataset = wdsx.WebDataset(uneven_shards.urls, shardshuffle=True, manifest=False).shuffle(100).batched(4)
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=2)
    iterator = iter(loader)
    for _ in range(10):
        next(iterator)
    state = loader.state_dict()
    assert json.loads(json.dumps(state)) == state
