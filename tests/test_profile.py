"""Where a WebLoader's time goes (``loader.stats()``, ``wdsx bench --profile``) and the stall
watchdog: a stage that sleeps is the one named. No assertion depends on how long anything
takes beyond the sleep dwarfing everything else."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

import wdsx


def nap(sample):
    time.sleep(0.01)
    return sample


def stuck(sample):
    if sample["__key__"] == "s001/00003":
        time.sleep(2)
    return sample


def test_the_stage_that_sleeps_takes_the_most_time(shards):
    dataset = wdsx.WebDataset(shards.urls).map(nap).decode().to_tuple("txt", "cls").batched(10)
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=2, profile=True)
    assert sum(len(batch[1]) for batch in loader) == 100
    stats = loader.stats()
    slowest = max(stats.stages, key=lambda label: stats.stages[label][0])
    assert slowest == "map(nap)"
    assert stats.stages["map(nap)"][1] == 100
    assert stats.batches == 10
    assert "map(nap)" in str(stats)


def test_without_profiling_the_loader_still_splits_main_process_time(shards):
    loader = wdsx.WebLoader(wdsx.WebDataset(shards.urls).batched(10), batch_size=None, num_workers=1)
    for _ in loader:
        pass
    stats = loader.stats(reset=True)
    assert stats.batches == 10 and not stats.stages
    assert stats.waiting_for_data > 0 and stats.in_trainer >= 0
    assert loader.stats().batches == 0


@pytest.mark.slow  # waits out the stall timeout
def test_a_stalled_loader_is_reported_with_its_shard_offset_and_stage(shards):
    dataset = wdsx.WebDataset(shards.urls).map(stuck).to_tuple("__key__").batched(5)
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=0, profile=True, stall_timeout=0.5)
    assert sum(len(keys) for (keys,) in loader) == 100
    stalls = loader.stats().stalls
    assert stalls, "the stall was not reported"
    assert re.search(rf"at byte \d+ of {re.escape(shards.urls[1])}", stalls[0])
    assert "running stage: map(stuck)" in stalls[0]


@pytest.mark.slow  # waits out the stall timeout in a worker process
def test_a_stalled_worker_sends_its_report_to_the_main_process(shards):
    dataset = wdsx.WebDataset(shards.urls).map(stuck).to_tuple("__key__").batched(5)
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=1, stall_timeout=0.5)
    assert sum(len(keys) for (keys,) in loader) == 100
    stalls = loader.stats().stalls
    assert stalls and stalls[0].startswith("wdsx worker 0 has produced nothing")
    assert shards.urls[1] in stalls[0]


@pytest.mark.slow  # a subprocess importing torch
def test_wdsx_bench_profile_prints_the_stages(shards):
    done = subprocess.run(
        [sys.executable, "-m", "wdsx.commands.cli", "bench", *shards.urls, "--profile", "--workers", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "main: waiting for data" in done.stdout and "map(_with_size)" in done.stdout
