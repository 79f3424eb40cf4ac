"""The epoch planner: spans partition the epoch, shares give equal batch counts, and an
elastic re-deal hands out exactly what was not consumed. The oracle enumerates every
(shard, ordinal) pair of the epoch and tests span membership by comparing pairs."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wdsx.read import deal as planning
from wdsx.state.position import Position, PositionTable


def all_samples(counts: list[int]) -> list[tuple[int, int]]:
    return [(pos, ordinal) for pos, count in enumerate(counts) for ordinal in range(count)]


def members(span: planning.Span, counts: list[int]) -> list[tuple[int, int]]:
    low, high = (span.start, span.start_ordinal), (span.end, span.end_ordinal)
    return [pair for pair in all_samples(counts) if low <= pair < high]


def covered(plan: planning.ConsumerPlan, counts: list[int]) -> list[tuple[int, int]]:
    return [pair for span in plan.spans for pair in members(span, counts)]


counts_strategy = st.lists(st.integers(0, 30), min_size=1, max_size=9)


@settings(max_examples=300, deadline=None)
@given(counts=counts_strategy, consumers=st.integers(1, 9))
def test_exact_plans_partition_the_epoch(counts, consumers):
    plans = planning.plan_epoch(consumers, counts, len(counts))
    seen = Counter(pair for plan in plans for pair in covered(plan, counts))
    assert seen == Counter(all_samples(counts))
    sizes = [len(covered(plan, counts)) for plan in plans]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=300, deadline=None)
@given(
    counts=counts_strategy,
    consumers=st.integers(1, 9),
    batch=st.integers(1, 8),
    partial=st.booleans(),
    remainder=st.sampled_from(["pad", "drop"]),
)
@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_pad_and_drop_give_equal_batch_counts(counts, consumers, batch, partial, remainder):
    total = sum(counts)
    plans = planning.plan_epoch(consumers, counts, len(counts), batch, partial, remainder)
    sizes = [len(covered(plan, counts)) for plan in plans]
    batches = {(math.ceil if partial else math.floor)(size / batch) for size in sizes}
    assert len(batches) == 1
    plain = Counter(
        pair for plan in plans for span in plan.spans if not span.pad for pair in members(span, counts)
    )
    padded = sum(len(members(span, counts)) for plan in plans for span in plan.spans if span.pad)
    assert all(n == 1 for n in plain.values())  # nothing is read twice except as marked padding
    if remainder == "pad" and partial:
        assert set(plain) == set(all_samples(counts))
        assert padded < consumers or total == 0
    else:
        assert padded == 0
        assert total - len(plain) < consumers * batch


def test_fewer_shards_than_consumers_splits_inside_shards():
    plans = planning.plan_epoch(8, [10, 6], 2)
    sizes = [len(covered(plan, [10, 6])) for plan in plans]
    assert sizes == [2] * 8


def test_uncounted_plans_deal_whole_shards():
    plans = planning.plan_epoch(3, None, 7)
    shards = [[pos for span in plan.spans for pos in range(span.start, span.end)] for plan in plans]
    assert shards == [[0, 1, 2], [3, 4], [5, 6]]


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=7),
    old=st.integers(1, 6),
    new=st.integers(1, 6),
    progress=st.lists(st.floats(0, 1), min_size=6, max_size=6),
    buffered=st.integers(0, 3),
)
@pytest.mark.slow  # kept out of the fast loop (a few seconds)
def test_reshape_deals_exactly_what_was_not_consumed(counts, old, new, progress, buffered):
    plans = planning.plan_epoch(old, counts, len(counts))
    consumed: list[tuple[int, int]] = []
    unread: list[planning.Span] = []
    leftovers = []
    for plan, fraction in zip(plans, progress):
        pairs = covered(plan, counts)
        cut = int(len(pairs) * fraction)
        held = pairs[max(0, cut - buffered) : cut]  # read into a buffer, not delivered
        consumed.extend(pairs[: max(0, cut - buffered)])
        leftovers.extend(Position(str(pos), 0, ordinal) for pos, ordinal in held)
        if cut < len(pairs):
            pos, ordinal = pairs[cut]
            index = next(i for i, span in enumerate(plan.spans) if (pos, ordinal) in members(span, counts))
            unread.extend(planning.remaining(plan, index, pos, ordinal, None))
    new_plans = planning.reshape(unread, leftovers, new, counts)
    delivered = [(int(p.url), p.ordinal) for plan in new_plans for p in plan.leftovers]
    delivered += [pair for plan in new_plans for pair in covered(plan, counts)]
    assert Counter(consumed + delivered) == Counter(all_samples(counts))
    sizes = [len(plan.leftovers) + len(covered(plan, counts)) for plan in new_plans]
    assert max(sizes) - min(sizes) <= 1


def test_span_json_round_trip():
    plan = planning.ConsumerPlan([planning.Span(1, 2, 3, 4, 512, True)], [Position("s0", 1024, 3)])
    table = PositionTable()
    data = json.loads(json.dumps(plan.to_json(table)))
    assert planning.ConsumerPlan.from_json(data, PositionTable(table.urls)) == plan


def test_an_empty_epoch_deals_nothing():
    for remainder in ("exact", "pad", "drop"):
        plans = planning.plan_epoch(4, [0, 0, 0], 3, 8, True, remainder)
        assert [covered(plan, [0, 0, 0]) for plan in plans] == [[]] * 4
    assert planning.plan_epoch(3, [], 0) == [planning.ConsumerPlan([])] * 3
