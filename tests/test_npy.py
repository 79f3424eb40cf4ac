""".npy shards: rows equal ``np.load`` (the oracle), shuffled epochs are per-shard permutations
that change every epoch, whole-batch gathering gives the batches sample-by-sample collation
gives, and exact and elastic resume match the uninterrupted run."""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.records import make_npy_shards
from tests.fixtures.trials import EPOCHS, TRIAL_SPACE, batch_keys, resume_trial
from wdsx.core import rng
from wdsx.read import npy
from wdsx.read.npy import _sorting_permutation, draws, row_order


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Five shards of uneven length, rows of shape (3,)."""
    return make_npy_shards(str(tmp_path_factory.mktemp("npy")), [37, 5, 61, 37, 20])


def oracle_rows(urls) -> list[tuple[str, np.ndarray]]:
    """(key, row) of every row, in file order, from ``np.load``."""
    rows = []
    for url in urls:
        stem = os.path.basename(url)[: -len(".npy")]
        rows += [(f"{stem}/{i}", row) for i, row in enumerate(np.load(url))]
    return rows


@pytest.mark.parametrize(
    ("row_shape", "dtype"), [((3,), "float32"), ((2, 4), "int16"), ((), "int64"), ((5,), ">f8")]
)
def test_rows_equal_np_load(tmp_path, row_shape, dtype):
    data = make_npy_shards(str(tmp_path), [7, 1, 12], row_shape, dtype)
    samples = list(wdsx.WebDataset(data.urls, manifest=False))
    expected = oracle_rows(data.urls)
    assert [s["__key__"] for s in samples] == [key for key, _ in expected]
    for sample, (_, row) in zip(samples, expected):
        assert sample["npy"].dtype == row.dtype and sample["npy"].shape == row_shape
        assert np.array_equal(sample["npy"], row)
        assert sample["__position__"].offset == sample["__position__"].ordinal  # file order: row = ordinal


def test_a_shard_with_more_rows_than_its_count_is_an_error(shards):
    counts = [37, 4, 61, 37, 20]
    mapped = np.load(shards.urls[1], mmap_mode="r")
    fifth_row = mapped.offset + 4 * mapped[0].nbytes
    with pytest.raises(wdsx.ShardError, match="more than 4 rows") as raised:
        list(wdsx.WebDataset(shards.urls, counts=counts))
    assert raised.value.url == shards.urls[1] and raised.value.offset == fifth_row


def test_counts_come_from_headers_without_reading_rows(tmp_path):
    data = make_npy_shards(str(tmp_path), [10, 20])
    with open(data.urls[1], "rb+") as stream:  # cut the data: the header still says 20 rows
        stream.truncate(stream.seek(0, os.SEEK_END) - 30)
    dataset = wdsx.WebDataset(data.urls, manifest=False)
    assert dataset.reader.counts == [10, 20]
    with pytest.raises(wdsx.ShardError, match="feats-001.npy: the shard is shorter than its header says"):
        list(dataset)


@pytest.mark.parametrize(
    ("array", "reason"),
    [
        (np.asfortranarray(np.zeros((4, 3))), "Fortran order"),
        (np.array([{"a": 1}, None], dtype=object), "Python objects"),
        (np.float32(3), "0-dimensional"),
    ],
)
def test_arrays_without_readable_rows_are_refused(tmp_path, array, reason):
    path = str(tmp_path / "odd.npy")
    np.save(path, array, allow_pickle=True)
    with pytest.raises(wdsx.ShardError, match=reason):
        list(wdsx.WebDataset(path, manifest=False))


def test_the_row_permutation_is_splitmix64():
    seed = rng.derive_seed("any")
    assert draws(seed, 5).tolist() == [rng.draw(seed, i) for i in range(5)]


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 1000, 20_000, 300_000])
def test_a_row_order_sorts_the_rows_draws(rows):
    for seed in range(5):
        expected = np.argsort(draws(rng.derive_seed("rows", seed, "feats.npy"), rows))
        assert np.array_equal(row_order(rows, "feats.npy", seed), expected)


def test_draws_that_tie_in_their_high_bits_are_left_to_argsort():
    keys = np.array([(7 << 40) | 3, (7 << 40) | 1, 5], dtype=np.uint64)
    assert np.argsort(keys).tolist() == [2, 1, 0]
    assert _sorting_permutation(keys.copy()) is None  # row_order then sorts with argsort


def test_a_row_order_whose_draws_tie_falls_back_to_argsort(monkeypatch):
    # as when high bits tie: no order, and the draws overwritten
    monkeypatch.setattr(npy, "_sorting_permutation", lambda keys: keys.fill(0))
    expected = np.argsort(draws(rng.derive_seed("rows", 3, "feats.npy"), 1000))
    assert np.array_equal(row_order(1000, "feats.npy", 3), expected)


def test_the_row_order_of_a_big_shard_keeps_no_memory():
    """Orders reuse arrays between calls for shards of up to KEPT_ROWS rows only: the memory a
    thread keeps must not grow with the largest shard it ever ordered."""
    import tracemalloc

    rows = 3 * npy.KEPT_ROWS
    tracemalloc.start()
    try:
        order = row_order(rows, "big.npy", 1)
        assert order is not None and len(order) == rows
        del order
        kept, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert kept < 2 * 8 * npy.KEPT_ROWS + (1 << 20)


def test_shuffled_epochs_permute_each_shard_and_change(shards):
    dataset = wdsx.WebDataset(shards.urls, shardshuffle=True)
    epochs = [[s["__key__"] for s in dataset] for _ in range(3)]
    for keys in epochs:
        assert sorted(keys) == sorted(shards.keys)
        stems = [key.split("/")[0] for key in keys]
        assert len([i for i in range(1, len(stems)) if stems[i] != stems[i - 1]]) == len(shards.urls) - 1
    assert epochs[0] != epochs[1] != epochs[2]
    unshuffled = [s["__key__"] for s in wdsx.WebDataset(shards.urls)]
    assert unshuffled == shards.keys


@pytest.mark.parametrize("batch", [1, 4, 16, 64, 150])
def test_whole_batches_equal_sample_by_sample_collation(shards, batch):
    def pipeline(per_sample):
        dataset = wdsx.WebDataset(shards.urls, shardshuffle=True)
        return (dataset.map(lambda sample: sample) if per_sample else dataset).batched(batch)

    gathered, collated = list(pipeline(False)), list(pipeline(True))
    assert len(gathered) == len(collated)
    for fast, slow in zip(gathered, collated):
        assert list(fast) == list(slow)
        for field in fast:
            if isinstance(slow[field], np.ndarray):  # rows, and collated numbers
                assert np.array_equal(fast[field], slow[field]) and fast[field].dtype == slow[field].dtype
            else:
                assert fast[field] == slow[field] and list(fast[field]) == list(slow[field])
    rows = [sample for b in pipeline(False) for sample in wdsx.unbatched()([b])]
    assert [row["__key__"] for row in rows] == [k for b in collated for k in b["__key__"]]


def test_a_batch_owns_its_columns(shards):
    """Columns of one value per batch are copied from a template: changing one batch's must
    leave the next batch's as an untouched run gives them."""
    untouched = list(itertools.islice(wdsx.WebDataset(shards.urls).batched(4), 3))
    batches = iter(wdsx.WebDataset(shards.urls).batched(4))
    next(batches)  # (the first batch of a shard is joined from its first sample and the rest)
    changed = next(batches)
    for column in changed.values():
        if isinstance(column, (list, np.ndarray)):
            column[0] = column[1]  # (a seed column holds 0 too: the change must differ)
            column[1] = "changed" if isinstance(column, list) else 7
    following = next(batches)
    assert {"__url__", "__epoch_seed__"} <= set(following)
    for field, column in following.items():
        if isinstance(column, np.ndarray):
            assert np.array_equal(column, untouched[2][field])
        else:
            assert list(column) == list(untouched[2][field])


def test_rows_that_do_not_join_the_next_shard_batch_as_samples_do(tmp_path):
    """A batch spanning a float32 shard and a float64 one cannot be gathered whole: it must be
    what batching sample by sample gives (same columns, same types)."""
    urls = []
    for number, dtype in enumerate(["float32", "float64", "float32"]):
        urls.append(str(tmp_path / f"mixed-{number}.npy"))
        np.save(urls[-1], np.arange(3 * 7, dtype=dtype).reshape(7, 3))

    def pipeline(per_sample):
        dataset = wdsx.WebDataset(urls, shardshuffle=False)
        return (dataset.map(lambda sample: sample) if per_sample else dataset).batched(4)

    gathered, collated = list(pipeline(False)), list(pipeline(True))
    assert len(gathered) == len(collated)
    for fast, slow in zip(gathered, collated):
        assert list(fast) == list(slow)
        for field in fast:
            assert isinstance(fast[field], np.ndarray) == isinstance(slow[field], np.ndarray), field
            if isinstance(slow[field], np.ndarray):
                assert np.array_equal(fast[field], slow[field]) and fast[field].dtype == slow[field].dtype
            else:
                assert list(fast[field]) == list(slow[field])


def test_whole_batches_are_gathered_in_one_step(shards, monkeypatch):
    """Only the first row of each shard is read on its own; all the others are gathered, the
    ends of shards too (held until the next shard's rows complete their batch)."""
    from wdsx.read import npy

    calls = Counter()
    row = npy.Rows.row
    monkeypatch.setattr(npy.Rows, "row", lambda self, i: calls.update(["row"]) or row(self, i))
    batches = list(wdsx.WebDataset(shards.urls, shardshuffle=True).batched(8))
    assert sum(len(b["npy"]) for b in batches) == sum(shards.counts)
    assert sum(shards.counts) >= 10 * len(shards.urls) and calls["row"] <= len(shards.urls)


def build(urls, fused, bufsize, batch, workers, main_stages):
    dataset = wdsx.WebDataset(urls, shardshuffle=True)
    if fused:  # batches gathered whole from the rows
        dataset = dataset.batched(batch)
    else:
        dataset = dataset.shuffle(bufsize).to_tuple("__key__", "npy").batched(batch)
    if workers is None:
        return dataset
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
    if main_stages:
        loader = loader.unbatched().shuffle(main_stages[0]).batched(main_stages[1])
    return loader


@pytest.mark.parametrize(("fused", "workers"), [(True, None), (True, 2), (False, 0), (False, 2)])
def test_resume_equals_the_uninterrupted_run(shards, fused, workers):
    full = resume_trial(lambda: build(shards.urls, fused, 10, 6, workers, (9, 4) if workers else None), 0.45)
    assert Counter(k for b in full for k in b) == Counter(shards.keys * EPOCHS)


@pytest.mark.slow  # 30 kill/resume trials with worker processes
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fused=st.booleans(), **TRIAL_SPACE)
def test_kill_and_resume_trials(shards, workers, fused, bufsize, batch, main_stages, cut):
    resume_trial(
        lambda: build(shards.urls, fused, bufsize, batch, workers, main_stages if workers else None), cut
    )


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (0, 2)])
@pytest.mark.parametrize("fused", [False, True])
def test_elastic_resume_reads_the_rest_exactly_once(shards, old, new, fused):
    def loader(workers):
        inner = wdsx.WebLoader(
            build(shards.urls, fused, 12, 4, None, None), batch_size=None, num_workers=workers
        )
        return inner.unbatched().shuffle(10).batched(5)

    first = loader(old)
    iterator = iter(first)
    before = [key for _ in range(9) for key in batch_keys(next(iterator))]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    first.close()
    second = loader(new)
    second.load_state_dict(state)
    after = [key for batch in second for key in batch_keys(batch)]
    assert Counter(before + after) == Counter(shards.keys)


def test_ranks_share_the_epoch_and_resume_elastically(shards, monkeypatch):
    def loader():
        dataset = wdsx.WebDataset(shards.urls, shardshuffle=True, remainder="exact").batched(3)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=0)

    everything, states, consumed = [], [], []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        everything += [key for batch in loader() for key in batch_keys(batch)]
        ranked = iter(partial := loader())
        consumed += [key for _ in range(2) for key in batch_keys(next(ranked))]
        states.append(json.loads(json.dumps(partial.state_dict())))
    assert Counter(everything) == Counter(shards.keys)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = loader()
    resumed.load_state_dict({"format": "wdsx-global-state", "version": 1, "ranks": states})
    assert Counter(consumed + [key for b in resumed for key in batch_keys(b)]) == Counter(shards.keys)


def test_remote_shards_are_read_whole(shards, http_server):
    urls = []
    for url in shards.urls[:2]:
        with open(url, "rb") as stream:
            urls.append(http_server.add("remote-" + os.path.basename(url), stream.read()))
    expected = {"remote-" + key: row for key, row in oracle_rows(shards.urls[:2])}
    for shuffled in (False, True):
        samples = list(wdsx.WebDataset(urls, shardshuffle=shuffled).shuffle(5 if shuffled else 0))
        assert sorted(s["__key__"] for s in samples) == sorted(expected)
        assert all(np.array_equal(s["npy"], expected[s["__key__"]]) for s in samples)


def test_a_few_positions_of_a_remote_shard_are_read_row_by_row(shards, http_server, fault_proxy):
    from wdsx.read.shard import ReadSettings, read_positions
    from wdsx.state.position import Position

    with open(shards.urls[2], "rb") as stream:
        http_server.add("rows-feats-002.npy", stream.read())
    proxy = fault_proxy(http_server.port)
    url = f"http://127.0.0.1:{proxy.port}/rows-feats-002.npy"
    positions = [Position(url, 40, 0), Position(url, 3, 1, True)]
    samples = read_positions(positions, ReadSettings(wdsx.SourceOptions()))
    expected = np.load(shards.urls[2])
    assert [s["__key__"] for s in samples] == ["rows-feats-002/40", "rows-feats-002/3"]
    assert np.array_equal(samples[0]["npy"], expected[40]) and np.array_equal(samples[1]["npy"], expected[3])
    assert samples[1]["__pad__"] and samples[1]["__position__"].pad
    assert len(proxy.gets("rows-feats")) == 1 + len(positions)  # the header, then one request per row


def _with_header(text: bytes, version: bytes = b"\x01\x00") -> bytes:
    """A .npy file of 4 float32 rows whose header text is ``text`` (padded as numpy pads)."""
    header = text + b" " * (-(len(text) + 11) % 64) + b"\n"
    return b"\x93NUMPY" + version + len(header).to_bytes(2, "little") + header + bytes(16)


@pytest.mark.parametrize(
    ("text", "version", "said"),
    [
        (
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (4, ",
            b"\x01\x00",
            "not a readable .npy header",
        ),
        (b"{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", b"\x01\x04", "format version 1.4"),
    ],
)
def test_a_header_numpy_cannot_parse_is_a_shard_error(tmp_path, text, version, said):
    """numpy's header parser raises tokenize's TokenError on an unclosed parenthesis, and numpy
    reads no minor version but 0 (fuzz findings: the first escaped as TokenError)."""
    path = str(tmp_path / "odd.npy")
    with open(path, "wb") as stream:
        stream.write(_with_header(text, version))
    with pytest.raises(Exception):  # noqa: B017 - the oracle refuses it too (TokenError, ValueError)
        np.load(path)
    with pytest.raises(wdsx.ShardError, match=f"odd.npy: .*{said}"):
        list(wdsx.WebDataset(path, manifest=False))


def test_rows_of_a_1d_shard_keep_its_dtype(tmp_path):
    """A row of bytes ending in NUL: a numpy scalar would shrink its dtype (S3 to S2), and a
    row re-read on resume would not (a fuzz finding)."""
    path = str(tmp_path / "codes.npy")
    array = np.array([b"ab\0", b"abc", b"\0\0\0"], dtype="S3")
    np.save(path, array)
    samples = list(wdsx.WebDataset(path, manifest=False))
    oracle = np.load(path)
    assert [s["npy"].dtype for s in samples] == [np.dtype("S3")] * 3
    assert [s["npy"].tobytes() for s in samples] == [oracle[i, ...].tobytes() for i in range(3)]


def test_version_3_headers_are_read_as_numpy_reads_them(tmp_path):
    """Version 3 headers are UTF-8 (field names beyond latin-1) and are not repaired as
    numpy repairs the Python 2 headers of versions 1 and 2."""
    path = str(tmp_path / "named.npy")
    array = np.zeros(3, dtype=[("é", "<i4"), ("snow☃", "u1")])
    with open(path, "wb") as stream:
        np.lib.format.write_array(stream, array, version=(3, 0))
    samples = list(wdsx.WebDataset(path, manifest=False))
    assert [s["npy"].dtype for s in samples] == [np.load(path).dtype] * 3
    with open(path, "rb") as stream:
        data = bytearray(stream.read())
    at = data.index(b"\n")
    data[at - 1 : at + 1] = b"\n\t"  # numpy's version 3 reader refuses the indented line
    with open(path, "wb") as stream:
        stream.write(bytes(data))
    with pytest.raises(ValueError):
        np.load(path)
    with pytest.raises(wdsx.ShardError, match="not a readable .npy header"):
        list(wdsx.WebDataset(path, manifest=False))


def test_a_subarray_dtype_in_the_header_is_a_shard_error(tmp_path):
    """A descr such as '4c8' names a subarray type, which np.save never writes and np.load
    cannot shape (a fuzz finding: a bare ValueError from numpy's reshape)."""
    path = str(tmp_path / "sub.npy")
    with open(path, "wb") as stream:
        stream.write(_with_header(b"{'descr': '4c8', 'fortran_order': False, 'shape': (2,), }")[:-16])
        stream.write(bytes(64))
    with pytest.raises(ValueError):
        np.load(path)
    with pytest.raises(wdsx.ShardError, match="sub.npy: .*subarray type"):
        list(wdsx.WebDataset(path, manifest=False))


def _damaged(tmp_path, kind: str) -> str:
    """A damaged .npy shard: no header, missing, or shorter than its header says."""
    path = str(tmp_path / f"{kind}.npy")
    if kind == "junk":
        with open(path, "wb") as out:
            out.write(b"not an npy file" * 5)
    elif kind == "short":
        np.save(path, np.arange(40, dtype=np.int64).reshape(10, 4))
        with open(path, "r+b") as out:
            out.truncate(os.path.getsize(path) - 80)
    return path


@pytest.mark.parametrize("kind", ["junk", "missing", "short"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_shard_is_skipped_by_a_continuing_handler_and_named_otherwise(tmp_path, kind, workers):
    good = str(tmp_path / "good.npy")
    np.save(good, np.arange(24, dtype=np.float32).reshape(6, 4))
    urls = [_damaged(tmp_path, kind), good]
    dataset = wdsx.WebDataset(urls, shardshuffle=False, handler=wdsx.warn_and_continue).batched(4)
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
    rows = np.concatenate([batch["npy"] for batch in loader])
    assert np.array_equal(rows, np.load(good))  # the good shard, whole, and nothing else
    with pytest.raises((wdsx.ShardError, wdsx.SourceError), match=urls[0]):
        list(wdsx.WebDataset(urls, shardshuffle=False))
