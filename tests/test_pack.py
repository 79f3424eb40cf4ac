"""Sequence packing (``wdsx.pack``): every token of every document comes out exactly once and in
order (checked against the shards read back with ``json.loads`` and ``np.load``), rows are laid
out consistently, best-fit packs about as tightly as an offline first-fit-decreasing packing
written here, and resuming (``wdsx.check_resume``) and re-dealing to another topology deliver
what an uninterrupted run does."""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict

import numpy as np
import pytest

import wdsx
from tests.fixtures.records import read_jsonl, write_jsonl

LENGTH = 64


# --- data and oracles ---------------------------------------------------------------------
def document_lengths(rng: random.Random, count: int, longest: int) -> list[int]:
    """Lengths from 0 to ``longest``, mostly short, some longer than a row."""
    return [min(longest, int(rng.expovariate(1 / 30))) for _ in range(count)]


def write_documents(directory: str, counts: list[int], seed: int = 0) -> list[str]:
    """JSONL shards ``docs-<n>.jsonl`` of ``{"tokens": [...]}`` lines, tokens numbered so that
    every token of the corpus is distinct."""
    rng = random.Random(seed)
    os.makedirs(directory, exist_ok=True)
    urls, next_token = [], 1
    for shard, count in enumerate(counts):
        values = []
        for size in document_lengths(rng, count, 3 * LENGTH):
            values.append({"tokens": list(range(next_token, next_token + size))})
            next_token += size
        urls.append(write_jsonl(os.path.join(directory, f"docs-{shard}.jsonl"), values))
    return urls


def oracle_documents(urls: list[str]) -> dict[str, list[int]]:
    """Each document's tokens by its key (``docs-<n>/<line>``), read with ``json.loads``."""
    return {
        f"{os.path.basename(url)[: -len('.jsonl')]}/{line}": value["tokens"]
        for url in urls
        for line, value in enumerate(read_jsonl(url))
    }


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[str]:
    return write_documents(str(tmp_path_factory.mktemp("pack")), [23, 9, 31, 17, 26, 14])


def tokens_of(sample: dict) -> dict:
    """A JSONL sample as the document pack() reads."""
    return {"__key__": sample["__key__"], "tokens": sample["json"]["tokens"]}


def dataset(urls, strategy="greedy", split=True, window=4, shuffle=7, **kw) -> wdsx.WebDataset:
    source = wdsx.WebDataset(urls, shardshuffle=True, manifest=False, **kw).shuffle(shuffle).map(tokens_of)
    return source.pack("tokens", LENGTH, strategy=strategy, window=window, split=split, pad=-1)


def pieces(rows) -> dict[str, list[tuple[int, list[int]]]]:
    """Each document's segments across ``rows``, as (start inside the document, tokens)."""
    found = defaultdict(list)
    for row in rows:
        cu = row["cu_seqlens"]
        for segment, (key, start) in enumerate(zip(row["__keys__"], row["__starts__"])):
            found[key].append((int(start), row["tokens"][cu[segment] : cu[segment + 1]].tolist()))
    return found


def assert_each_token_once(rows, documents: dict[str, list[int]], split: bool = True) -> None:
    """The rows' segments, put together per document by their starts, are each document
    (cut to a row where documents are not split), every token once and in order."""
    found = pieces(rows)
    expected = {key: tokens if split else tokens[:LENGTH] for key, tokens in documents.items() if tokens}
    assert set(found) == set(expected)
    for key, segments in found.items():
        segments.sort()
        assert [start for start, _ in segments] == list(
            np.cumsum([0] + [len(tokens) for _, tokens in segments[:-1]])
        ), key
        assert [token for _, tokens in segments for token in tokens] == expected[key], key


def assert_row_format(row: dict, pad: int = -1) -> None:
    """Tokens, segment ids, position ids and cu_seqlens of one row agree with each other."""
    cu = row["cu_seqlens"]
    sizes = np.diff(cu)
    used = int(cu[-1])
    assert row["tokens"].shape == (LENGTH,) and cu[0] == 0 and (sizes > 0).all()
    assert cu.dtype == row["segment_ids"].dtype == row["position_ids"].dtype == np.int32
    assert len(row["__keys__"]) == len(row["__starts__"]) == len(sizes)
    expected_segments = [segment + 1 for segment, size in enumerate(sizes) for _ in range(size)]
    assert row["segment_ids"].tolist() == expected_segments + [0] * (LENGTH - used)
    expected_positions = [position for size in sizes for position in range(size)]
    assert row["position_ids"].tolist() == expected_positions + [0] * (LENGTH - used)
    assert (row["tokens"][used:] == pad).all() and (row["tokens"][:used] != pad).all()


# --- tokens and rows ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
@pytest.mark.parametrize("split", [True, False], ids=["split", "whole"])
def test_every_token_comes_out_once_in_order(corpus, strategy, split):
    rows = list(dataset(corpus, strategy, split))
    assert_each_token_once(rows, oracle_documents(corpus), split)
    for row in rows:
        assert_row_format(row)
    if strategy == "greedy" and split:
        assert all(row["cu_seqlens"][-1] == LENGTH for row in rows[:-1])  # every row full but the last
    if not split:
        assert all(len(set(row["__keys__"])) == len(row["__keys__"]) for row in rows)
        assert all(start == 0 for row in rows for start in row["__starts__"])


def test_npy_rows_pack_as_documents(tmp_path):
    urls = []
    for shard, count in enumerate([5, 8]):
        rows = np.arange(count * 24, dtype=np.int32).reshape(count, 24) + 1000 * shard
        urls.append(str(tmp_path / f"rows-{shard}.npy"))
        np.save(urls[-1], rows)
    packed = list(wdsx.WebDataset(urls, manifest=False).pack("npy", 40, pad=-1))
    documents = {
        f"rows-{shard}/{line}": row.tolist()
        for shard, url in enumerate(urls)
        for line, row in enumerate(np.load(url))
    }
    assert_each_token_once([{**row, "tokens": row["npy"]} for row in packed], documents)
    assert packed[0]["npy"].dtype == np.int64


def test_documents_longer_than_a_row_are_cut_or_refused_when_not_split():
    documents = [{"__key__": "a", "tokens": list(range(1, 11))}, {"__key__": "b", "tokens": [7, 8]}]
    rows = list(wdsx.pack("tokens", 4, split=False)(documents))
    assert [row["tokens"].tolist() for row in rows] == [[1, 2, 3, 4], [7, 8, 0, 0]]
    with pytest.raises(ValueError, match="'a' has 10 tokens, more than a row of 4"):
        list(wdsx.pack("tokens", 4, split=False, overlong="error")(documents))


def test_bad_arguments_and_documents_are_refused():
    with pytest.raises(ValueError, match="strategy must be one of"):
        wdsx.pack("tokens", 8, strategy="first_fit")
    with pytest.raises(ValueError, match="length must be positive"):
        wdsx.pack("tokens", 0)
    with pytest.raises(ValueError, match="1-D sequence of integer tokens"):
        list(wdsx.pack("tokens", 8)([{"tokens": [[1, 2]]}]))
    with pytest.raises(ValueError, match="dicts with a 'tokens' field"):
        list(wdsx.pack("tokens", 8)([{"text": "x"}]))


@pytest.mark.parametrize(("dtype", "tokens"), [(np.int16, [1, 40000]), (np.uint16, [-5, 3])])
def test_tokens_a_dtype_cannot_hold_are_refused_not_wrapped(dtype, tokens):
    with pytest.raises(ValueError, match="which dtype u?int16 cannot hold"):
        list(wdsx.pack("tokens", 8, dtype=dtype)([{"__key__": "a", "tokens": tokens}]))
    with pytest.raises(ValueError, match="pad -1 does not fit dtype uint16"):
        wdsx.pack("tokens", 8, pad=-1, dtype=np.uint16)
    fitting = [{"__key__": "b", "tokens": np.array([1, 30000], dtype=np.int64)}]
    row = next(iter(wdsx.pack("tokens", 4, dtype=np.int16)(fitting)))
    assert row["tokens"].dtype == np.int16 and row["tokens"].tolist() == [1, 30000, 0, 0]
    cut = [{"__key__": "c", "tokens": [1, 2, 3, 4, 99999]}]  # the token too big is cut off
    row = next(iter(wdsx.pack("tokens", 4, split=False, dtype=np.int16)(cut)))
    assert row["tokens"].tolist() == [1, 2, 3, 4]


def test_collate_packed_gives_varlen_boundaries_over_the_flattened_batch():
    documents = [{"__key__": str(n), "tokens": np.full(n, n)} for n in (3, 4, 2, 5)]
    rows = list(wdsx.pack("tokens", 6, split=False)(documents))
    batch = wdsx.collate_packed(rows)
    assert batch["tokens"].shape == batch["segment_ids"].shape == (len(rows), 6)
    flat = batch["tokens"].reshape(-1)
    cu = batch["cu_seqlens"]
    assert cu[0] == 0 and cu[-1] == flat.size and set(range(0, flat.size, 6)) <= set(cu.tolist())
    assert batch["max_seqlen"] == int(np.diff(cu).max())
    segments = [flat[a:b].tolist() for a, b in zip(cu[:-1], cu[1:])]
    assert [s for s in segments if s[0] != 0] == [[n] * n for n in (3, 4, 2, 5)]  # rows 3 | 4 2 | 5
    assert batch["__keys__"] == [row["__keys__"] for row in rows]


def saved_after(packed: wdsx.WebDataset, rows: int) -> dict:
    """The state of ``packed`` after ``rows`` rows, through JSON, without its digest (so that
    a test can change it and still reach the stage's own checks)."""
    iterator = iter(packed)
    for _ in range(rows):
        next(iterator)
    state = json.loads(json.dumps(packed.state_dict()))
    state.pop("digest", None)
    return state


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rows", lambda rows: [3] * len(rows), "open rows numbered 0, 1"),
        ("starts", lambda starts: starts[:-1], "starts"),
        ("starts", lambda starts: [10**6] * len(starts), "at most the"),
    ],
)
def test_a_damaged_state_is_refused_naming_its_field(corpus, field, value, message):
    state = saved_after(dataset(corpus, "best_fit"), 3)
    held = state["stages"]["pack"]
    assert len(held["rows"]) > 1
    held[field] = value(held[field])
    resumed = dataset(corpus, "best_fit")
    with pytest.raises(wdsx.StateError, match=message):
        resumed.load_state_dict(state)
        next(iter(resumed))


# --- packing efficiency against an offline first-fit-decreasing ---------------------------
def first_fit_decreasing(lengths: list[int], length: int, window: int) -> int:
    """Rows an offline first-fit-decreasing packing needs when it sees the documents in
    consecutive groups of at most ``window`` rows' worth of tokens (what ``window`` open rows
    can hold): each group sorted longest first, each document into the first row it fits."""
    rows = 0
    group: list[int] = []
    for size in [*lengths, None]:
        if size is None or sum(group) + size > window * length:
            free: list[int] = []
            for item in sorted(group, reverse=True):
                slot = next((i for i, room in enumerate(free) if room >= item), None)
                if slot is None:
                    free.append(length - item)
                else:
                    free[slot] -= item
            rows += len(free)
            group = []
        if size is not None:
            group.append(size)
    return rows


@pytest.mark.parametrize("window", [4, 16, 64])
def test_best_fit_packs_within_two_percent_of_first_fit_decreasing(window):
    rng = np.random.default_rng(5)
    length = 2048
    lengths = np.clip(rng.lognormal(5.5, 1.0, 6000).astype(int), 1, length).tolist()
    documents = [{"__key__": str(i), "tokens": np.ones(n, dtype=np.int32)} for i, n in enumerate(lengths)]
    rows = list(wdsx.pack("tokens", length, strategy="best_fit", window=window, split=False)(documents))
    ours = sum(lengths) / (len(rows) * length)
    reference = sum(lengths) / (first_fit_decreasing(lengths, length, window) * length)
    assert ours >= reference - 0.02, (ours, reference)


# --- exact and elastic resume --------------------------------------------------------------
def loader(urls, strategy, split, workers, **kw) -> wdsx.WebLoader:
    rows = dataset(urls, strategy, split, **kw).batched(3, collation_fn=wdsx.collate_packed)
    return wdsx.WebLoader(rows, batch_size=None, num_workers=workers)


@pytest.mark.slow  # kept out of the fast loop (a few seconds)
@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_resumes_exactly_in_process(corpus, strategy):
    report = wdsx.check_resume(lambda: loader(corpus, strategy, True, 0), cuts=4, epochs=2)
    assert report.identical, str(report)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_resumes_exactly_with_workers(corpus, strategy, workers):
    report = wdsx.check_resume(
        lambda: loader(corpus, strategy, strategy == "greedy", workers), cuts=3, epochs=2
    )
    assert report.identical, str(report)


def rows_of(batch) -> list[dict]:
    """The rows of a collate_packed batch, with each row's own cu_seqlens."""
    rows = []
    for number, keys in enumerate(batch["__keys__"]):
        tokens = batch["tokens"][number]
        used = int((batch["segment_ids"][number] > 0).sum())
        sizes = np.bincount(batch["segment_ids"][number][:used])[1:]
        cu = np.concatenate([[0], np.cumsum(sizes)])
        rows.append(
            {"tokens": tokens, "cu_seqlens": cu, "__keys__": keys, "__starts__": batch["__starts__"][number]}
        )
    return rows


def held_starts(state) -> list[int]:
    """The emitted counts of every document the packing stages of a saved state hold."""
    if isinstance(state, list):
        return [start for value in state for start in held_starts(value)]
    if not isinstance(state, dict):
        return []
    if "pack" in state.get("stages", {}):
        return state["stages"]["pack"]["starts"]
    return [start for value in state.values() for start in held_starts(value)]


def rank_states(monkeypatch, urls, strategy, split, ranks, workers, taken):
    """Rows delivered and states saved by ``ranks`` ranks of ``workers`` workers, each rank
    stopped after ``taken`` batches."""
    rows, states = [], []
    for rank in range(ranks):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        first = loader(urls, strategy, split, workers, remainder="exact", counts="scan")
        batches = iter(first)
        rows += [row for _ in range(taken) for row in rows_of(next(batches))]
        states.append(json.loads(json.dumps(first.state_dict())))
        del batches
        first.close()
    return rows, {"format": "wdsx-global-state", "version": 1, "ranks": states}


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_a_re_deal_to_another_topology_delivers_every_token_once(monkeypatch, corpus, strategy, split):
    before, state = rank_states(monkeypatch, corpus, strategy, split, ranks=4, workers=2, taken=2)
    assert any(held_starts(state)) == split  # split documents held part-emitted at the cut
    after = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        resumed = loader(corpus, strategy, split, 1, remainder="exact", counts="scan")
        resumed.load_state_dict(state)
        after += [row for batch in resumed for row in rows_of(batch)]
    assert_each_token_once(before + after, oracle_documents(corpus), split)


def mixed_loader(urls, workers) -> wdsx.WebLoader:
    """``pack`` after a mixture of two sources (half of the shards each), on ``workers``."""
    half = len(urls) // 2
    sources = [
        wdsx.WebDataset(part, shardshuffle=True, manifest=False).shuffle(7).map(tokens_of)
        for part in (urls[:half], urls[half:])
    ]
    rows = wdsx.Mix(sources, [1, 2], seed=5).pack("tokens", LENGTH, pad=-1)
    batches = rows.batched(3, collation_fn=wdsx.collate_packed)
    return wdsx.WebLoader(batches, batch_size=None, num_workers=workers)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_re_deal_of_pack_after_a_mixture_delivers_every_token_once(corpus, workers):
    """The mixer re-deals each source on its own; the packer's counts of tokens already
    emitted must reach the new readers with them, or a document split at the cut comes back
    whole."""
    first = mixed_loader(corpus, 2)
    batches = iter(first)
    before = [row for _ in range(3) for row in rows_of(next(batches))]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    first.close()
    assert any(held_starts(state))  # a document was split at the cut
    resumed = mixed_loader(corpus, workers)
    resumed.load_state_dict(state)
    after = [row for batch in resumed for row in rows_of(batch)]
    assert_each_token_once(before + after, oracle_documents(corpus))


def main_process_loader(urls, workers) -> wdsx.DataPipeline:
    """``pack`` among the loader's own stages: documents come from the workers in batches."""
    documents = wdsx.WebDataset(urls, shardshuffle=True, manifest=False).shuffle(7).map(tokens_of)
    loader = wdsx.WebLoader(documents.batched(4, collation_fn=None), batch_size=None, num_workers=workers)
    rows = loader.unlisted().pack("tokens", LENGTH, pad=-1)
    return rows.batched(3, collation_fn=wdsx.collate_packed)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_re_deal_of_pack_in_the_loaders_own_stages_delivers_every_token_once(corpus, workers):
    first = main_process_loader(corpus, 2)
    batches = iter(first)
    before = [row for _ in range(3) for row in rows_of(next(batches))]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    assert any(held_starts(state))  # a document was split at the cut
    resumed = main_process_loader(corpus, workers)
    resumed.load_state_dict(state)
    after = [row for batch in resumed for row in rows_of(batch)]
    assert_each_token_once(before + after, oracle_documents(corpus))
