"""Exact resumption: keys before a checkpoint + keys after restoring it == an uninterrupted run.

The oracle is the uninterrupted run itself, over two epochs. The interrupted run stops at a
random batch, its state goes through JSON, and a new loader (new DataLoader worker
processes) restores it and finishes the two epochs as a training script would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wdsx
from tests.fixtures.trials import TRIAL_SPACE

EPOCHS = 2


def flat_keys(batch) -> list[str]:
    keys = batch[0]
    return [keys] if isinstance(keys, str) else list(keys)


def build(urls, shardshuffle, bufsize, batch, workers, main_stages):
    dataset = wdsx.WebDataset(urls, shardshuffle=shardshuffle, manifest=False).shuffle(bufsize)
    dataset = dataset.to_tuple("__key__", "cls").batched(batch)
    if workers is None:
        return dataset
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)
    if main_stages:
        loader = loader.unbatched().shuffle(main_stages[0]).batched(main_stages[1])
    return loader


def run_epochs(loader, first_epoch=0, stop_after=None):
    """Keys of each batch over the remaining epochs; stops after ``stop_after`` batches and
    returns (keys, epoch at the stop, state)."""
    seen = []
    for epoch in range(first_epoch, EPOCHS):
        for batch in loader:
            seen.append(flat_keys(batch))
            if stop_after is not None and len(seen) == stop_after:
                state = json.loads(json.dumps(loader.state_dict()))
                return seen, epoch, state
    return seen, EPOCHS, json.loads(json.dumps(loader.state_dict()))


@pytest.mark.slow  # 40 kill/resume trials with worker processes
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shardshuffle=st.booleans(), **TRIAL_SPACE)
def test_resume_equals_uninterrupted_run(
    uneven_shards, workers, shardshuffle, bufsize, batch, main_stages, cut
):
    if workers is None:
        main_stages = None
    args = (uneven_shards.urls, shardshuffle, bufsize, batch, workers, main_stages)
    full, _, _ = run_epochs(build(*args))
    assert sorted(k for b in full for k in b) == sorted(uneven_shards.keys * EPOCHS)
    stop = max(1, int(cut * len(full)))
    first = build(*args)
    before, epoch, state = run_epochs(first, stop_after=stop)
    first.close()
    second = build(*args)
    second.load_state_dict(state)
    after, _, _ = run_epochs(second, first_epoch=epoch)
    assert before + after == full


@pytest.mark.slow
def test_checkpoint_before_the_first_batch_and_after_the_last(uneven_shards):
    args = (uneven_shards.urls, True, 7, 5, 2, None)
    full, _, _ = run_epochs(build(*args))
    fresh = build(*args)
    fresh.load_state_dict(json.loads(json.dumps(build(*args).state_dict())))
    assert run_epochs(fresh)[0] == full
    done = build(*args)
    run_epochs(done)
    state = done.state_dict()
    assert state["epoch"] == EPOCHS
    three = build(*args)
    epochs = [[flat_keys(b) for b in three] for _ in range(EPOCHS + 1)]
    later = build(*args)
    later.load_state_dict(state)
    assert [flat_keys(b) for b in later] == epochs[EPOCHS]


def test_epoch_end_checkpoint_resumes_with_the_next_epochs_order(uneven_shards):
    dataset = wdsx.WebDataset(uneven_shards.urls, shardshuffle=True, manifest=False).to_tuple("__key__")
    epoch0 = [k for (k,) in dataset]
    state = dataset.state_dict()
    epoch1 = [k for (k,) in dataset]
    resumed = wdsx.WebDataset(uneven_shards.urls, shardshuffle=True, manifest=False).to_tuple("__key__")
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert [k for (k,) in resumed] == epoch1 != epoch0


@pytest.mark.slow  # starts a new Python process
def test_resume_in_a_fresh_process(uneven_shards, tmp_path):
    """The restored run happens in another Python process, as after a crash."""
    args = (uneven_shards.urls, True, 100, 8, 2, (20, 6))
    full, _, _ = run_epochs(build(*args))
    before, epoch, state = run_epochs(build(*args), stop_after=len(full) // 3)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(__import__("os").getcwd())!r})
        from tests.test_resume import build, run_epochs
        loader = build(*{args!r})
        loader.load_state_dict(json.load(open({str(path)!r})))
        print(json.dumps(run_epochs(loader, first_epoch={epoch})[0]))
        """
    )
    output = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=240
    )
    after = json.loads(output.stdout.strip().splitlines()[-1])
    assert before + after == full


def test_mismatched_checkpoints_fail_loudly(uneven_shards):
    loader = build(uneven_shards.urls, True, 7, 4, 0, None)
    next(iter(loader))
    state = loader.state_dict()
    other = build(uneven_shards.urls, True, 9, 4, 0, None)
    with pytest.raises(wdsx.StateError, match="shuffle"):
        other.load_state_dict(state)
    fewer = build(uneven_shards.urls[:-1], True, 7, 4, 0, None)
    with pytest.raises(wdsx.StateError, match="shards"):
        fewer.load_state_dict(state)
    with pytest.raises(wdsx.StateError, match="not a wdsx"):
        other.load_state_dict({"epoch": 3})


def test_opaque_stages_refuse_to_checkpoint_unless_not_strict(uneven_shards):
    def passthrough(src):
        yield from src

    dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False).compose(passthrough)
    next(iter(dataset))
    with pytest.raises(wdsx.NotResumableError, match="passthrough"):
        dataset.state_dict()
    with pytest.warns(UserWarning, match="strict=False"):
        dataset.state_dict(strict=False)
    marked = wdsx.WebDataset(uneven_shards.urls, manifest=False).compose(wdsx.stateless(passthrough))
    next(iter(marked))
    assert marked.state_dict()["format"] == "wdsx-state"


def test_loaded_state_cannot_be_silently_dropped(uneven_shards):
    dataset = wdsx.WebDataset(uneven_shards.urls, manifest=False)
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    fresh = wdsx.WebDataset(uneven_shards.urls, manifest=False)
    fresh.load_state_dict(state)
    with pytest.raises(wdsx.StateError, match="finished pipeline"):
        fresh.batched(3)
    with pytest.raises(wdsx.StateError, match="set_epoch"):
        fresh.set_epoch(5)
    assert fresh.state_dict() == state


def test_with_epoch_checkpoint_resumes_inside_a_nominal_epoch(uneven_shards):
    def pipeline():
        return (
            wdsx.WebDataset(uneven_shards.urls, shardshuffle=True, manifest=False)
            .shuffle(9)
            .to_tuple("__key__")
            .with_epoch(100)
        )

    reference = pipeline()
    nominal = [[key for (key,) in reference] for _ in range(5)]
    first = pipeline()
    seen = [[key for (key,) in first] for _ in range(2)]
    iterator = iter(first)
    seen.append([next(iterator)[0] for _ in range(37)])
    state = json.loads(json.dumps(first.state_dict()))
    resumed = pipeline()
    resumed.load_state_dict(state)
    seen[2] += [key for (key,) in resumed]
    seen += [[key for (key,) in resumed] for _ in range(2)]
    assert seen == nominal and all(len(epoch) == 100 for epoch in seen)


def test_repeat_checkpoint_keeps_the_passes_left(shards):
    def pipeline():
        return (
            wdsx.WebDataset(shards.urls[:2], shardshuffle=True, manifest=False).to_tuple("__key__").repeat(2)
        )

    reference = pipeline()
    iterations = [[key for (key,) in reference] for _ in range(2)]
    first = pipeline()
    iterator = iter(first)
    before = [next(iterator)[0] for _ in range(50)]  # inside the second pass of the first iter()
    resumed = pipeline()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert before + [key for (key,) in resumed] == iterations[0]
    assert [key for (key,) in resumed] == iterations[1]


def torch_worker_split(src):
    """A worker splitter as code written for webdataset has them: it asks torch which
    DataLoader worker it runs in."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return (url for index, url in enumerate(src) if index % workers == worker)


@pytest.mark.slow  # worker processes at each cut
def test_a_splitter_asking_torch_resumes_exactly(uneven_shards):
    """A resumed epoch can start in a worker other than the first (the loader hands the
    readers to processes in turn from there): torch must name the reader, not the process."""

    def loader(worker_type="process"):
        dataset = wdsx.WebDataset(uneven_shards.urls, workersplitter=torch_worker_split, manifest=False)
        dataset = dataset.to_tuple("__key__").batched(3)
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=2, worker_type=worker_type)

    epoch = [key for (keys,) in loader() for key in keys]
    assert sorted(epoch) == sorted(uneven_shards.keys)
    report = wdsx.check_resume(loader, cuts=4, epochs=2)
    assert report.identical, str(report)
    with pytest.raises(ValueError, match="thread worker cannot run a WebDataset's own workersplitter"):
        list(loader("thread"))  # torch has no worker info for a thread: each would read every shard
