"""WebLoader with ``worker_type="thread"``: reader threads deliver what worker processes
deliver, batch for batch; their checkpoints are the same (they load into process-worker
loaders and back, and re-deal to other worker counts); errors reach the trainer; no thread
outlives the iteration. Oracles: process-worker loaders, plain iterations of the dataset,
uninterrupted runs and the keys written into the shards."""

from __future__ import annotations

import gc
import json
import logging
import threading
import traceback
from collections import Counter

import pytest

import wdsx


def shuffled(urls: list[str], batch: int | None = 4) -> wdsx.DataPipeline:
    """Shuffled shards and samples, keys and classes, batched by the dataset unless ``batch``
    is None."""
    dataset = wdsx.WebDataset(urls, shardshuffle=True, manifest=False).shuffle(10).to_tuple("__key__", "cls")
    return dataset.batched(batch) if batch is not None else dataset


def loader(urls: list[str], workers: int, worker_type: str, **kwargs) -> wdsx.WebLoader:
    kwargs.setdefault("batch_size", None)
    batch = 4 if kwargs["batch_size"] is None else None
    return wdsx.WebLoader(shuffled(urls, batch), num_workers=workers, worker_type=worker_type, **kwargs)


def batches(items) -> list[list[str]]:
    """Each batch's keys (a DataLoader-batched batch has the keys as a list, too)."""
    return [list(batch[0]) for batch in items]


def keys(items) -> list[str]:
    return [key for batch in batches(items) for key in batch]


def reader_threads() -> list[str]:
    """The loader threads still running: readers, and their stall watchdogs (a stopped
    watchdog ends at its next look, which the join waits for)."""
    for thread in threading.enumerate():
        if thread.name.startswith("wdsx-watchdog"):
            thread.join(5.0)
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("wdsx-")]


def test_one_reader_thread_delivers_the_datasets_own_batches(uneven_shards):
    plain = batches(shuffled(uneven_shards.urls))
    assert batches(loader(uneven_shards.urls, 1, "thread")) == plain


@pytest.mark.parametrize("workers", [2, 3])
def test_reader_threads_take_turns_as_worker_processes_do(uneven_shards, monkeypatch, workers):
    """The oracle: each worker's share read by a plain iteration that the environment makes
    that worker, the shares' batches then taken in turn, skipping finished ones."""
    shares = []
    for worker in range(workers):
        monkeypatch.setenv("WORKER", str(worker))
        monkeypatch.setenv("NUM_WORKERS", str(workers))
        shares.append(batches(shuffled(uneven_shards.urls)))
    monkeypatch.delenv("WORKER")
    monkeypatch.delenv("NUM_WORKERS")
    in_turn = [share[turn] for turn in range(max(map(len, shares))) for share in shares if turn < len(share)]
    assert len({len(share) for share in shares}) > 1  # some worker finishes first
    assert batches(loader(uneven_shards.urls, workers, "thread")) == in_turn


@pytest.mark.parametrize(
    "settings",
    [{}, {"batch_size": 3}, {"batch_size": 3, "drop_last": True}, {"batch_size": 5, "prefetch_factor": 1}],
    ids=["dataset-batched", "loader-batched", "drop-last", "prefetch-1"],
)
def test_every_sample_once_per_epoch(uneven_shards, settings):
    delivered = keys(loader(uneven_shards.urls, 3, "thread", **settings))
    if settings.get("drop_last"):
        assert len(delivered) == len(set(delivered)) and set(delivered) <= set(uneven_shards.keys)
    else:
        assert Counter(delivered) == Counter(uneven_shards.keys)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize(
    "settings",
    [{}, {"batch_size": 3}, {"batch_size": 3, "drop_last": True}],
    ids=["dataset", "loader", "drop"],
)
def test_thread_workers_deliver_the_batches_of_process_workers(uneven_shards, workers, settings):
    processes = loader(uneven_shards.urls, workers, "process", **settings)
    threads = loader(uneven_shards.urls, workers, "thread", **settings)
    for _ in range(2):  # two epochs: each with its own shard order
        assert batches(threads) == batches(processes)


def test_each_reader_thread_is_its_own_worker(uneven_shards):
    def tagged(sample):
        return {**sample, "worker": "/".join(map(str, wdsx.pytorch_worker_info()))}

    started = []
    dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).map(tagged).to_tuple("__key__", "worker")
    threaded = wdsx.WebLoader(
        dataset.batched(5),
        batch_size=None,
        num_workers=3,
        worker_type="thread",
        worker_init_fn=started.append,
    )
    seen = {worker for _, workers in threaded for worker in workers}
    assert seen == {"0/1/0/3", "0/1/1/3", "0/1/2/3"}
    assert sorted(started) == [0, 1, 2]
    assert wdsx.pytorch_worker_info() == (0, 1, 0, 1)  # the main thread is no worker


def test_check_resume_passes_with_thread_workers(shards):
    def make() -> wdsx.WebLoader:
        dataset = (
            wdsx.WebDataset(shards.pattern, shardshuffle=True)
            .shuffle(10)
            .map(lambda sample: {**sample, "noise": wdsx.sample_rng(sample).random()})
            .to_tuple("__key__", "noise")
        )
        threaded = wdsx.WebLoader(dataset, batch_size=3, num_workers=2, worker_type="thread")
        return threaded.unbatched().shuffle(8).batched(5)

    report = wdsx.check_resume(make, cuts=3, epochs=2)
    assert report.identical, str(report)


def saved_mid_epoch(urls: list[str], workers: int, worker_type: str, taken: int) -> tuple[list[str], dict]:
    """The keys of the first ``taken`` batches and the loader's state (a JSON round trip) then."""
    first = loader(urls, workers, worker_type)
    iterator = iter(first)
    before = keys(next(iterator) for _ in range(taken))
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    first.close()
    return before, state


def resumed_keys(urls: list[str], workers: int, worker_type: str, state: dict) -> list[str]:
    second = loader(urls, workers, worker_type)
    second.load_state_dict(state)
    return keys(second)


@pytest.mark.parametrize("workers", [2, 3])
def test_thread_checkpoints_resume_on_thread_workers(uneven_shards, workers):
    urls = uneven_shards.urls
    full = keys(loader(urls, 2, "thread"))
    before, state = saved_mid_epoch(urls, 2, "thread", 9)
    after = resumed_keys(urls, workers, "thread", state)
    assert Counter(before + after) == Counter(full) == Counter(uneven_shards.keys)
    if workers == 2:
        assert before + after == full


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize(("saved", "resumed"), [("thread", "process"), ("process", "thread")])
@pytest.mark.parametrize("workers", [2, 1])
def test_checkpoints_move_between_threads_and_processes(uneven_shards, saved, resumed, workers):
    urls = uneven_shards.urls
    full = keys(loader(urls, 2, "process"))
    before, state = saved_mid_epoch(urls, 2, saved, 9)
    after = resumed_keys(urls, workers, resumed, state)
    assert Counter(before + after) == Counter(uneven_shards.keys)
    if workers == 2:
        assert before + after == full  # the same readers: the very same sequence


def test_an_error_in_a_stage_reaches_the_trainer_with_its_traceback(uneven_shards):
    victim = uneven_shards.keys[40]

    def fragile(sample):
        if sample["__key__"] == victim:
            raise ValueError(f"cannot take {victim}")
        return sample

    dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).map(fragile).to_tuple("__key__")
    threaded = wdsx.WebLoader(dataset.batched(4), batch_size=None, num_workers=2, worker_type="thread")
    with pytest.raises(ValueError, match=f"cannot take {victim}") as caught:
        list(threaded)
    frames = [frame.name for frame in traceback.extract_tb(caught.value.__traceback__)]
    assert "fragile" in frames
    assert any("reader thread" in note for note in caught.value.__notes__)
    del caught, threaded
    gc.collect()
    assert reader_threads() == []


def test_no_thread_outlives_an_abandoned_iteration(uneven_shards):
    threaded = loader(uneven_shards.urls, 3, "thread", batch_size=2, prefetch_factor=1)
    for number, _ in enumerate(threaded):
        if number == 3:
            break
    running = [thread.name for thread in threading.enumerate() if thread.name.startswith("wdsx-reader")]
    assert len(running) == 3
    del threaded
    gc.collect()  # a loader and its pipeline form reference cycles: the collector frees them
    assert reader_threads() == []


def test_closing_the_loader_stops_its_threads(uneven_shards):
    threaded = loader(uneven_shards.urls, 2, "thread")
    iterator = iter(threaded)
    next(iterator)
    threaded.close()
    assert reader_threads() == []
    after_epoch = loader(uneven_shards.urls, 2, "thread")
    list(after_epoch)
    assert reader_threads() == []


def test_stats_count_the_batches_of_reader_threads(uneven_shards):
    threaded = loader(uneven_shards.urls, 2, "thread", profile=True)
    delivered = len(list(threaded))
    stats = threaded.stats()
    assert stats.batches == delivered
    assert stats.stages and stats.transport == 0.0


def test_thread_workers_need_a_wdsx_pipeline_and_a_known_worker_type(uneven_shards):
    with pytest.raises(TypeError, match="wdsx pipeline"):
        wdsx.WebLoader(list(range(10)), num_workers=2, worker_type="thread")
    with pytest.raises(ValueError, match="worker_type"):
        loader(uneven_shards.urls, 2, "fibre")
    with pytest.raises(ValueError, match="shuffle"):  # as a DataLoader refuses it
        loader(uneven_shards.urls, 2, "thread", shuffle=True)


def test_checkpoints_at_the_short_last_batches_resume_exactly(tmp_path):
    from tests.fixtures.shards import make_shards

    data = make_shards(str(tmp_path), [10, 10, 10, 11])

    def make() -> wdsx.WebLoader:
        dataset = wdsx.WebDataset(data.urls, manifest=False).to_tuple("__key__")
        return wdsx.WebLoader(
            dataset, batch_size=3, num_workers=2, worker_type="thread", collate_fn=lambda b: [k for (k,) in b]
        )

    reference = make()
    full = [batch for _ in range(2) for batch in reference]
    per_epoch = len(full) // 2
    assert sorted(key for batch in full[:per_epoch] for key in batch) == sorted(data.keys)
    for cut in range(per_epoch - 3, per_epoch + 1):
        first = make()
        iterator = iter(first)
        before = [next(iterator) for _ in range(cut)]
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        resumed = make()
        resumed.load_state_dict(state)
        assert before + list(resumed) + list(resumed) == full, cut


def test_a_datasets_with_epoch_continues_its_streams_across_loader_epochs(uneven_shards):
    def make() -> wdsx.WebLoader:
        dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).to_tuple("__key__").with_epoch(5)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=2, worker_type="thread")

    reference = make()
    epochs = [[key for (key,) in reference] for _ in range(4)]
    assert all(len(epoch) == 10 for epoch in epochs)
    assert len({key for epoch in epochs for key in epoch}) == 40  # a stream, not a replay
    first = make()
    seen = [[key for (key,) in first]]
    iterator = iter(first)
    seen.append([next(iterator)[0] for _ in range(3)])
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = make()
    resumed.load_state_dict(state)
    seen[1] += [key for (key,) in resumed]
    seen += [[key for (key,) in resumed] for _ in range(2)]
    assert seen == epochs


def test_a_stalled_reader_thread_is_reported_by_its_worker_number(shards):
    """The stage blocks until the watchdog has logged its stall (bounded, for a broken one);
    the other reader, held up by the round robin, may be reported too."""
    reported = threading.Event()

    class Signal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "has produced nothing" in record.getMessage() and "stuck)" in record.getMessage():
                reported.set()

    def stuck(sample):
        if sample["__key__"] == shards.keys[30]:
            reported.wait(30.0)
        return sample

    signal = Signal()
    logging.getLogger("wdsx").addHandler(signal)
    try:
        dataset = wdsx.WebDataset(shards.urls, manifest=False).map(stuck).to_tuple("__key__").batched(5)
        threaded = wdsx.WebLoader(
            dataset, batch_size=None, num_workers=2, worker_type="thread", profile=True, stall_timeout=0.2
        )
        assert Counter(key for (batch,) in threaded for key in batch) == Counter(shards.keys)
    finally:
        logging.getLogger("wdsx").removeHandler(signal)
    assert reported.is_set()
    stalls = threaded.stats().stalls
    assert stalls and all(report.startswith("wdsx worker ") for report in stalls)
    assert any("running stage: map(" in report and "stuck)" in report for report in stalls)


@pytest.mark.slow  # worker processes
@pytest.mark.parametrize("rank", [0, 1])
def test_on_each_rank_threads_read_what_processes_read(uneven_shards, monkeypatch, rank):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    threads = batches(loader(uneven_shards.urls, 2, "thread"))
    assert threads == batches(loader(uneven_shards.urls, 2, "process"))
