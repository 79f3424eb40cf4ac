"""Resume cost: time to the first batch after resuming deep inside a big shard, and the size
of a checkpoint."""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import wdsx


def _pipeline(url: str) -> wdsx.WebDataset:
    return wdsx.WebDataset(url, manifest=False).decode("rgb8").to_tuple("jpg", "cls").batched(64)


def state_at(url: str, samples: int) -> dict:
    """The state of the pipeline after ``samples`` samples (taken at a batch boundary)."""
    dataset = _pipeline(url)
    iterator = iter(dataset)
    for _ in range(samples // 64):
        next(iterator)
    return json.loads(json.dumps(dataset.state_dict()))


def first_batch_seconds(url: str, state: dict) -> float:
    """Seconds from loading ``state`` into a new pipeline to holding the next batch."""
    start = time.perf_counter()
    dataset = _pipeline(url)
    dataset.load_state_dict(state)
    next(iter(dataset))
    return time.perf_counter() - start


def times_to_first_batch(url: str, states: dict[str, dict], rounds: int = 9) -> dict[str, float]:
    """Median seconds to the first batch after loading each of ``states``, the states taking
    turns for ``rounds`` rounds: each time is a few tens of milliseconds, so a busy moment of the
    machine would otherwise land on one state only and look like a cost of its depth."""
    times: dict[str, list[float]] = {name: [] for name in states}
    for _ in range(rounds):
        for name, state in states.items():
            times[name].append(first_batch_seconds(url, state))
    return {name: statistics.median(values) for name, values in times.items()}


def skip_to_first_batch(url: str, samples: int) -> float:
    """What resuming costs without offsets: skip ``samples`` decoded-free samples, then batch
    (webdataset's only option, ``.slice(n, None)`` before decoding)."""
    import webdataset

    start = time.perf_counter()
    dataset = webdataset.WebDataset(url, shardshuffle=False).slice(samples, None).decode("rgb8")
    next(iter(dataset.to_tuple("jpg", "cls").batched(64)))
    return time.perf_counter() - start


def resume_latency(url: str, total: int) -> dict[str, Any]:
    early, late = total // 10, total * 9 // 10
    states = {"ttfb_10": state_at(url, early), "ttfb_90": state_at(url, late)}
    result = {
        **times_to_first_batch(url, states),
        "skip_10": skip_to_first_batch(url, early),
        "skip_90": skip_to_first_batch(url, late),
    }
    result["ratio"] = result["ttfb_90"] / result["ttfb_10"]
    return result


def state_size(urls: list[str]) -> dict[str, int]:
    """Bytes of the JSON state of a shuffle(1000) pipeline through WebLoader with 2 workers."""
    dataset = (
        wdsx.WebDataset(urls, shardshuffle=True)
        .shuffle(1000)
        .decode("rgb8")
        .to_tuple("jpg", "cls")
        .batched(64)
    )
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=2)
    iterator = iter(loader)
    for _ in range(40):
        next(iterator)
    text = json.dumps(loader.state_dict())
    del iterator
    loader.close()
    return {"bytes": len(text), "compact_bytes": len(json.dumps(json.loads(text), separators=(",", ":")))}
