"""WebLoader and torchdata's StatefulDataLoader: exact resume, and re-dealing to a different
number of workers (every remaining sample of the epoch read exactly once)."""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import wdsx
from tests.fixtures.shards import make_shards


def dataset(urls, bufsize=10, batch=4, shardshuffle=True):
    return (
        wdsx.WebDataset(urls, shardshuffle=shardshuffle, manifest=False)
        .shuffle(bufsize)
        .to_tuple("__key__", "cls")
        .batched(batch)
    )


def keys(batches) -> list[str]:
    return [key for batch in batches for key in batch[0]]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly(uneven_shards, workers):
    def loader():
        return StatefulDataLoader(dataset(uneven_shards.urls), batch_size=None, num_workers=workers)

    full = [list(b[0]) for b in loader()]
    first = loader()
    iterator = iter(first)
    before = [list(next(iterator)[0]) for _ in range(len(full) // 2)]
    state = first.state_dict()
    del iterator, first
    second = loader()
    second.load_state_dict(state)
    after = [list(b[0]) for b in second]
    assert before + after == full


@pytest.mark.slow  # several loaders with worker processes
def test_stateful_dataloader_resumes_exactly_after_one_worker_ran_out(tmp_path):
    """Worker 1's shard is short: from cut 8 on, its share has run out, and torchdata resumes
    it from the state its dataset had then, which must deliver nothing more this epoch."""
    data = make_shards(str(tmp_path), [40, 12])

    def loader():
        return StatefulDataLoader(dataset(data.urls, bufsize=0), batch_size=None, num_workers=2)

    full = [list(b[0]) for b in loader()]
    assert len(full) == 13
    for cut in (2, 8, 10, 12):
        first = loader()
        iterator = iter(first)
        before = [list(next(iterator)[0]) for _ in range(cut)]
        state = first.state_dict()
        del iterator, first
        second = loader()
        second.load_state_dict(state)
        assert before + [list(b[0]) for b in second] == full, cut
    # a checkpoint taken again after resuming from one where worker 1 had run out
    first = loader()
    iterator = iter(first)
    seen = [list(next(iterator)[0]) for _ in range(8)]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator, first
    second = loader()
    second.load_state_dict(state)
    iterator = iter(second)
    seen.append(list(next(iterator)[0]))
    state = json.loads(json.dumps(second.state_dict()))
    del iterator, second
    third = loader()
    third.load_state_dict(state)
    assert seen + [list(b[0]) for b in third] == full


@pytest.mark.parametrize(("old", "new"), [(2, 3), (3, 1), (2, 0), (0, 2), (1, 3)])
@pytest.mark.parametrize("main_shuffle", [False, True])
def test_changing_the_number_of_workers_reads_the_rest_exactly_once(uneven_shards, old, new, main_shuffle):
    def loader(workers):
        result = wdsx.WebLoader(dataset(uneven_shards.urls), batch_size=None, num_workers=workers)
        return result.unbatched().shuffle(20).batched(5) if main_shuffle else result

    first = loader(old)
    iterator = iter(first)
    before = keys(next(iterator) for _ in range(9))
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    first.close()
    second = loader(new)
    second.load_state_dict(state)
    after = keys(second)
    assert Counter(before + after) == Counter(uneven_shards.keys)


def test_pipeline_state_refuses_another_reader(uneven_shards):
    """A reader's own state cannot silently start another reader's share."""
    first = wdsx.WebLoader(dataset(uneven_shards.urls), batch_size=None, num_workers=2)
    iterator = iter(first)
    next(iterator)
    worker_state = first.state_dict()["stages"]["loader"]["states"][0]
    del iterator
    first.close()
    plain = dataset(uneven_shards.urls)
    with pytest.raises(wdsx.StateError, match="reader"):
        plain.load_state_dict(worker_state)


def test_every_epoch_has_a_new_order_through_workers(uneven_shards):
    loader = wdsx.WebLoader(dataset(uneven_shards.urls, shardshuffle=True), batch_size=None, num_workers=2)
    epoch0, epoch1 = keys(loader), keys(loader)
    assert sorted(epoch0) == sorted(epoch1) == sorted(uneven_shards.keys)
    assert epoch0 != epoch1  # a new shard order every epoch, workers included


def test_with_epoch_on_the_loader_continues_the_stream(uneven_shards):
    def loader():
        return wdsx.WebLoader(
            dataset(uneven_shards.urls, bufsize=0, batch=10), batch_size=None, num_workers=2
        )

    plain = loader()
    data_epochs = [[list(b[0]) for b in plain] for _ in range(3)]
    nominal_loader = loader().with_epoch(7)
    nominal = [[list(b[0]) for b in nominal_loader] for _ in range(8)]
    assert [len(epoch) for epoch in nominal] == [7] * 8
    stream = [batch for epoch in nominal for batch in epoch]
    expected = [batch for epoch in data_epochs for batch in epoch]
    assert stream == expected[: len(stream)]  # one continuous stream through the data epochs


def test_two_loaders_in_one_process_keep_their_own_state(uneven_shards):
    """A training and a validation loader without workers, iterated alternately."""
    train = wdsx.WebLoader(dataset(uneven_shards.urls[:4]), batch_size=None, num_workers=0)
    val = wdsx.WebLoader(dataset(uneven_shards.urls[4:]), batch_size=None, num_workers=0)
    full = keys(wdsx.WebLoader(dataset(uneven_shards.urls[:4]), batch_size=None, num_workers=0))
    train_batches, val_batches = iter(train), iter(val)
    before = []
    for _ in range(3):
        before += keys([next(train_batches)])
        next(val_batches)
    state = train.state_dict()
    resumed = wdsx.WebLoader(dataset(uneven_shards.urls[:4]), batch_size=None, num_workers=0)
    resumed.load_state_dict(state)
    assert before + keys(resumed) == full


@pytest.mark.parametrize("workers", [0, 1])
def test_read_errors_keep_their_type_through_workers(tmp_path, workers):
    data = make_shards(str(tmp_path), [10])
    with open(data.urls[0], "r+b") as stream:
        stream.truncate(4 * 1024 + 600)
    loader = wdsx.WebLoader(wdsx.WebDataset(data.urls, manifest=False), batch_size=None, num_workers=workers)
    with pytest.raises(wdsx.ShardError):
        list(loader)
    gone = make_shards(str(tmp_path / "gone"), [2]).urls[0]
    bad = wdsx.WebDataset([gone], manifest=False)
    os.remove(gone)  # vanishes after the dataset is built: the reader finds it missing
    with pytest.raises(wdsx.SourceError):
        list(wdsx.WebLoader(bad, batch_size=None, num_workers=workers))


def test_decoding_errors_keep_their_type_through_workers(tmp_path):
    from tests.fixtures.shards import write_tar

    path = write_tar(str(tmp_path / "bad.tar"), [("k.jpg", b"not a jpeg")])
    loader = wdsx.WebLoader(
        wdsx.WebDataset(path, manifest=False).decode("rgb8"), batch_size=None, num_workers=1
    )
    with pytest.raises(wdsx.DecodingError):
        list(loader)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_checkpoint_at_a_short_last_batch_with_dataloader_batching(tmp_path, workers):
    data = make_shards(str(tmp_path), [10, 10, 10, 10])

    def loader():
        dataset = wdsx.WebDataset(data.urls, manifest=False).to_tuple("__key__")
        return wdsx.WebLoader(
            dataset, batch_size=3, num_workers=workers, collate_fn=lambda b: [k for (k,) in b]
        )

    reference = loader()
    full = [batch for _ in range(2) for batch in reference]
    per_epoch = len(full) // 2
    for cut in range(per_epoch - 3, per_epoch + 1):
        first = loader()
        iterator = iter(first)
        before = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(first.state_dict()))
        del iterator
        first.close()
        resumed = loader()
        resumed.load_state_dict(state)
        assert before + list(resumed) + list(resumed) == full, cut


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_with_epoch_continues_across_loader_epochs_and_checkpoints(uneven_shards, workers):
    def loader():
        dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).to_tuple("__key__").with_epoch(5)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)

    reference = loader()
    epochs = [[key for (key,) in reference] for _ in range(4)]
    readers = max(1, workers)
    assert all(len(epoch) == 5 * readers for epoch in epochs)
    assert len({key for epoch in epochs for key in epoch}) == 20 * readers  # a stream, not a replay
    first = loader()
    seen = [[key for (key,) in first]]
    iterator = iter(first)
    seen.append([next(iterator)[0] for _ in range(3)])
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    first.close()
    resumed = loader()
    resumed.load_state_dict(state)
    seen[1] += [key for (key,) in resumed]
    seen += [[key for (key,) in resumed] for _ in range(2)]
    assert seen == epochs


@pytest.mark.slow  # several loaders over scanned shards
def test_elastic_resume_of_a_run_that_counted_by_scanning(tmp_path, monkeypatch):
    data = make_shards(str(tmp_path), [13, 4, 9, 17, 6])

    def loader():
        dataset = wdsx.WebDataset(data.urls, manifest=False, remainder="exact").to_tuple("__key__").batched(3)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=0)

    states, consumed = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ranked = loader()
        batches = iter(ranked)
        consumed += [key for _ in range(2) for key in next(batches)[0]]
        states.append(json.loads(json.dumps(ranked.state_dict())))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = loader()
    resumed.load_state_dict({"format": "wdsx-global-state", "version": 1, "ranks": states})
    assert Counter(consumed + keys(resumed)) == Counter(data.keys)


@pytest.mark.parametrize("before", [1, 2])
def test_a_drop_remainder_re_dealt_on_one_rank_loses_nothing(tmp_path, before):
    """remainder="drop" on one rank: the old plan dropped nothing here, so the re-dealt rest,
    read by 4 workers, holds every sample the uninterrupted run delivers, once."""
    data = make_shards(str(tmp_path), [13, 7, 20, 1, 9])

    def loader(workers):
        dataset = wdsx.WebDataset(data.urls, remainder="drop", counts="scan").to_tuple("__key__").batched(3)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers, worker_type="thread")

    full = keys(loader(before))
    first = loader(before)
    iterator = iter(first)
    cut = [key for (batch,) in itertools.islice(iterator, 8) for key in batch]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    resumed = loader(4)
    resumed.load_state_dict(state)
    assert Counter(cut + keys(resumed)) == Counter(full) == Counter(data.keys)


def test_a_loader_dropped_mid_epoch_lets_its_workers_go_at_once(uneven_shards):
    """Freed by the garbage collector (a loader and its pipeline form reference cycles), the
    workers must still be told the epoch ended: otherwise each takes torch's 5 s status
    interval to notice. The bound leaves a wide margin over the ~0.1 s this takes."""
    import gc
    import multiprocessing
    import time

    others = set(multiprocessing.active_children())  # workers other tests' loaders left
    dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).shuffle(50).to_tuple("__key__").batched(7)
    pipeline = wdsx.WebLoader(dataset, batch_size=None, num_workers=2).unbatched().shuffle(20).batched(5)
    iterator = iter(pipeline)
    next(iterator)
    assert len(set(multiprocessing.active_children()) - others) == 2
    started = time.monotonic()
    del iterator, pipeline
    gc.collect()
    assert time.monotonic() - started < 4.0
    assert set(multiprocessing.active_children()) - others == set()


def run_script(script: str, urls: list[str]):
    """``script`` run by a fresh interpreter with the shard URLs as arguments; it must succeed."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", script, *urls], capture_output=True, text=True, check=True, timeout=120
    )


_LEAVES_EPOCHS_EARLY = """
import sys
import wdsx

dataset = wdsx.WebDataset(sys.argv[1:], manifest=False).batched(4)
loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=2)
for epoch in range(4):
    for step, batch in enumerate(loader):
        if step == 2:
            break
print("done")
"""


@pytest.mark.slow  # a fresh interpreter
def test_epochs_left_with_break_print_nothing_from_later_workers(uneven_shards):
    """A loop left with ``break`` leaves its epoch's generator to the garbage collector, which
    may run it to its end inside a worker forked for a later epoch: that copy must not try to
    shut down workers it did not start (torch asserts it is their parent, and the assertion's
    traceback reached the user's terminal once per worker)."""
    result = run_script(_LEAVES_EPOCHS_EARLY, uneven_shards.urls)
    assert result.stdout.strip() == "done"
    assert "Exception ignored" not in result.stderr and "AssertionError" not in result.stderr, result.stderr


_IMPORTS_IN_WORKERS = """
import importlib.abc, json, os, sys

importers = []  # the pids of the processes that imported numpy.random


class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numpy.random":
            importers.append(os.getpid())
        return None


sys.meta_path.insert(0, Recorder())
import wdsx

assert "numpy.random" not in sys.modules
dataset = wdsx.WebDataset(sys.argv[1:], manifest=False).map(lambda s: os.getpid() in importers)
print(json.dumps([bool(flag) for flag in wdsx.WebLoader(dataset, batch_size=None, num_workers=2)]))
"""


@pytest.mark.slow  # a fresh interpreter
def test_workers_inherit_numpy_random_instead_of_importing_it(uneven_shards):
    """torch's worker loop seeds numpy's global generator: a forked worker of a process that
    has not imported ``numpy.random`` imports it, every worker, every epoch. (Spawned workers
    import everything anew whatever this process does; numpy 1 imports numpy.random with
    numpy, so there is nothing to see.)"""
    import multiprocessing
    import subprocess
    import sys

    if multiprocessing.get_start_method() != "fork":
        pytest.skip("workers are not forked here")
    plain = subprocess.run(
        [sys.executable, "-c", "import sys, wdsx; print('numpy.random' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    if plain.stdout.strip() == "True":
        pytest.skip("importing wdsx imports numpy.random here")
    result = run_script(_IMPORTS_IN_WORKERS, uneven_shards.urls)
    imported_in_worker = json.loads(result.stdout)
    assert imported_in_worker and not any(imported_in_worker)


_CATCHES_CTRL_C = """
import json, os, signal, sys, time
import wdsx

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal (see test_orphans)
dataset = wdsx.WebDataset(sys.argv[1:], shardshuffle=False, manifest=False).to_tuple("__key__")
iterator = iter(wdsx.WebLoader(dataset.batched(5), batch_size=None, num_workers=2))
keys, interrupted = [], False
while True:
    try:
        keys.extend(next(iterator)[0])
        if len(keys) == 20 and not interrupted:
            os.killpg(os.getpgrp(), signal.SIGINT)  # Ctrl-C in a terminal: the whole group
            time.sleep(1)
    except StopIteration:
        break
    except KeyboardInterrupt:
        interrupted = True
print(json.dumps({"interrupted": interrupted, "keys": keys}))
"""


@pytest.mark.slow  # a trainer of its own
def test_a_trainer_that_catches_ctrl_c_goes_on_with_its_loader(uneven_shards):
    """Ctrl-C reaches the trainer and its workers; the trainer catches it and iterates on: it
    must get every sample of the epoch once, as if nothing had happened (PyTorch's workers die
    of the signal)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _CATCHES_CTRL_C, *uneven_shards.urls],
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    outcome = json.loads(result.stdout)
    assert outcome["interrupted"]
    assert Counter(outcome["keys"]) == Counter(uneven_shards.keys)


@pytest.mark.slow  # worker processes on two simulated ranks, resumed on other worker counts
@pytest.mark.parametrize("resumed_on", [0, 3])
def test_a_ranks_own_state_on_other_workers_is_refused_and_a_gathered_one_re_dealt(
    tmp_path, monkeypatch, resumed_on
):
    """Re-dealing one rank's rest alone could leave the ranks with different numbers of
    batches (a hang under DDP): that needs the gathered state, which every rank re-deals
    alike, reading every sample once and giving each rank the same number of batches."""
    data = make_shards(str(tmp_path), [3, 5, 2, 7, 4, 6, 1, 3, 5, 2])

    def loader(workers):
        dataset = wdsx.WebDataset(data.urls, counts=data.counts).to_tuple("__key__")
        return wdsx.WebLoader(dataset.batched(2), batch_size=None, num_workers=workers)

    monkeypatch.setenv("WORLD_SIZE", "2")
    seen, states = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        first = loader(2)
        batches = iter(first)
        seen += [key for _ in range(3) for key in next(batches)[0]]
        states.append(json.loads(json.dumps(first.state_dict())))
        del batches
        first.close()
    gathered = {"format": "wdsx-global-state", "version": 1, "ranks": states}
    for wrong in ([states[1]], [states[0], states[0]]):  # a rank missing, a rank twice
        with pytest.raises(wdsx.StateError, match="it must hold every rank's state, in rank order"):
            loader(resumed_on).load_state_dict({**gathered, "ranks": wrong})
    counts = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        with pytest.raises(wdsx.StateError, match="gather every rank.s state"):
            loader(resumed_on).load_state_dict(states[rank])
        resumed = loader(resumed_on)
        resumed.load_state_dict(gathered)
        rest = [batch[0] for batch in resumed]
        counts.append(len(rest))
        seen += [key for batch in rest for key in batch]
    assert counts[0] == counts[1]
    assert set(seen) == set(data.keys)
    assert len(seen) - len(data.keys) <= 2 * 2  # the pad policy repeats at most a batch per rank


@pytest.mark.parametrize(("before", "after", "cut"), [(2, 3, 26), (2, 1, 26), (1, 2, 25)])
def test_a_re_deal_in_a_later_pass_of_repeat_reads_the_rest_once(tmp_path, before, after, cut):
    """A checkpoint taken in repeat(2)'s second pass, resumed on another number of workers:
    the rest of that pass, then nothing more, as the uninterrupted run (each sample twice)."""
    shards = make_shards(str(tmp_path), [13, 7, 20, 1, 9])

    def loader(workers: int) -> wdsx.WebLoader:
        dataset = wdsx.WebDataset(shards.urls, shardshuffle=True).shuffle(5).to_tuple("__key__")
        return wdsx.WebLoader(
            dataset.batched(3).repeat(2), batch_size=None, num_workers=workers, worker_type="thread"
        )

    uninterrupted = Counter(key for (keys,) in loader(2) for key in keys)
    first = loader(before)
    batches = iter(first)
    delivered = [key for (keys,) in itertools.islice(batches, cut) for key in keys]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = loader(after)
    resumed.load_state_dict(state)
    delivered += [key for (keys,) in resumed for key in keys]
    assert Counter(delivered) == uninterrupted


@pytest.mark.parametrize("taken", [(0, 0), (3, 0)])
def test_a_gathered_state_of_ranks_that_had_received_nothing_is_re_dealt(tmp_path, monkeypatch, taken):
    """Ranks checkpointed before their first batch, re-dealt to one rank of three workers. All
    of them: the epoch starts afresh there, as a fresh run on that topology reads it. One of
    two: the rest of the old epoch, as the uninterrupted two-rank run reads it (padding
    included), each sample exactly as often."""
    data = make_shards(str(tmp_path), [13, 7, 20, 1, 9, 11])

    def loader(workers: int) -> wdsx.WebLoader:
        dataset = wdsx.WebDataset(data.urls, shardshuffle=True).to_tuple("__key__").batched(3)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers, worker_type="thread")

    def keys(batches) -> list[str]:
        return [key for (keys,) in batches for key in keys]

    monkeypatch.setenv("WORLD_SIZE", "2")
    seen, states, two_ranks = [], [], []
    for rank, batches_taken in enumerate(taken):
        monkeypatch.setenv("RANK", str(rank))
        two_ranks += keys(loader(2))
        first = loader(2)
        batches = iter(first)
        seen += keys(itertools.islice(batches, batches_taken))
        states.append(json.loads(json.dumps(first.state_dict())))
        del batches
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    one_rank = keys(loader(3))
    resumed = loader(3)
    resumed.load_state_dict({"format": "wdsx-global-state", "version": 1, "ranks": states})
    seen += keys(resumed)
    assert Counter(seen) == Counter(one_rank if sum(taken) == 0 else two_ranks)


def test_a_plain_dataloaders_workers_give_every_rank_the_same_number_of_batches(tmp_path, monkeypatch):
    """torch's own DataLoader (as third-party training code uses it) over a WebDataset without
    a manifest, two ranks of two workers: the workers count the shards' samples as the main
    process does, so both ranks yield the same number of batches (no DDP hang) and every
    sample is read, each once but for the marked padding."""
    import torch

    data = make_shards(str(tmp_path), [10, 10, 5])
    monkeypatch.setenv("WORLD_SIZE", "2")
    batches, seen = [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        dataset = wdsx.WebDataset(data.urls, shardshuffle=False, manifest=False)
        dataset = dataset.map(lambda s: (s["__key__"], s.get("__pad__", False))).batched(4)
        mine = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
        batches.append(len(mine))
        seen += [(key, pad) for keys, pads in mine for key, pad in zip(keys, pads)]
    assert batches[0] == batches[1]
    assert sorted(key for key, pad in seen if not pad) == sorted(data.keys)


def _keys_loader(urls, counts, workers, **dataset_options):
    dataset = wdsx.WebDataset(urls, counts=counts, **dataset_options).to_tuple("__key__").batched(4)
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers, worker_type="thread")


@pytest.mark.parametrize("after", [2, 3, 1])
def test_a_loaders_with_epoch_resumed_on_other_workers_ends_where_it_would_have(tmp_path, after):
    """loader.with_epoch(n), checkpointed after k batches and resumed on another number of
    workers: n - k batches are left in that epoch, as on the same workers, and len() says so."""
    data = make_shards(str(tmp_path), [13, 7, 20, 1, 9, 11])
    first = _keys_loader(data.urls, data.counts, 2).with_epoch(12)
    batches = iter(first)
    delivered = [keys for (keys,) in itertools.islice(batches, 5)]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = _keys_loader(data.urls, data.counts, after).with_epoch(12)
    resumed.load_state_dict(state)
    left = len(resumed)
    rest = [keys for (keys,) in resumed]
    assert len(rest) == left == 12 - 5
    seen = [key for keys in delivered + rest for key in keys]
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize("after", [3, 1])
def test_len_after_a_re_dealt_resume_is_what_is_left(tmp_path, after):
    """Resumed on another number of workers, len() counts the re-dealt shares: the batches
    that then arrive, which with those before are every sample of the epoch once."""
    data = make_shards(str(tmp_path), [13, 7, 20, 1, 9, 11])
    first = _keys_loader(data.urls, data.counts, 2)
    batches = iter(first)
    delivered = [key for (keys,) in itertools.islice(batches, 5) for key in keys]
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = _keys_loader(data.urls, data.counts, after)
    resumed.load_state_dict(state)
    left = len(resumed)
    rest = [keys for (keys,) in resumed]
    assert len(rest) == left
    assert sorted(delivered + [key for keys in rest for key in keys]) == sorted(data.keys)


def test_len_counts_each_epoch_and_each_pass_of_repeat(tmp_path):
    """Shard orders differ from epoch to epoch, and so do the partial batches of each worker:
    len() before each epoch, and of a loader repeating 2 passes (2 epochs), is what arrives."""
    data = make_shards(str(tmp_path), [37, 50, 23, 61, 44, 29, 55, 41])

    def loader() -> wdsx.WebLoader:
        dataset = wdsx.WebDataset(data.urls, counts=data.counts, shardshuffle=True).to_tuple("__key__")
        return wdsx.WebLoader(dataset.batched(8), batch_size=None, num_workers=2, worker_type="thread")

    for looped in (loader(), loader().repeat(2)):
        told, arrived = [], []
        for _ in range(5):
            told.append(len(looped))
            arrived.append(sum(1 for _ in looped))
        assert told == arrived
    assert len(set(arrived)) > 1  # (the epochs' batch counts differ, as this test needs)


def test_a_resampled_checkpoint_on_other_workers_says_why_it_cannot_resume(tmp_path):
    data = make_shards(str(tmp_path), [13, 7, 20])
    first = _keys_loader(data.urls, data.counts, 2, resampled=True).with_epoch(10)
    batches = iter(first)
    next(batches)
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    with pytest.raises(wdsx.StateError, match="resampled shards .* resumes only on the number of ranks"):
        _keys_loader(data.urls, data.counts, 3, resampled=True).with_epoch(10).load_state_dict(state)


@pytest.mark.parametrize("inner", ["with_epoch", "repeat"])
@pytest.mark.parametrize("cut", [3, 9])
def test_len_of_a_resumed_loader_over_a_dataset_that_repeats_is_what_arrives(tmp_path, inner, cut):
    """A loader over a dataset's own with_epoch(n) (endless streams the loader cuts) or
    repeat(2) (two epochs in one pass of the loader), resumed on the same workers: len()
    returns, and says how many batches then arrive."""
    data = make_shards(str(tmp_path), [7, 3, 9, 5, 4, 6, 8])

    def loader() -> wdsx.WebLoader:
        dataset = (
            wdsx.WebDataset(data.urls, counts=data.counts, shardshuffle=True).to_tuple("__key__").batched(4)
        )
        dataset = dataset.with_epoch(6) if inner == "with_epoch" else dataset.repeat(2)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=2, worker_type="thread")

    first = loader()
    batches = iter(first)
    for _ in range(cut):
        next(batches)
    state = json.loads(json.dumps(first.state_dict()))
    del batches
    resumed = loader()
    resumed.load_state_dict(state)
    told = len(resumed)
    assert sum(1 for _ in resumed) == told
