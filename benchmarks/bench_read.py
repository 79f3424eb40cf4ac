"""Reading throughput of wdsx against webdataset 1.0.2, same shards, same run.

Every pipeline is written once as a function of the module (``wds``), exactly as user code
would be, and run with both libraries; rates are medians of interleaved runs.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

from .measure import compare, in_subprocess

warnings.filterwarnings("ignore")


def raw(wds: Any, urls: list[str]) -> Any:
    return wds.WebDataset(urls, shardshuffle=False)


def decoded(wds: Any, urls: list[str]) -> Any:
    return wds.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls")


def shuffled_batches(wds: Any, urls: list[str]) -> Any:
    return (
        wds.WebDataset(urls, shardshuffle=False)
        .decode("rgb8")
        .to_tuple("jpg", "cls")
        .shuffle(1000)
        .batched(64)
    )


def count_samples(iterable: Any, batched: bool) -> int:
    if batched:
        return sum(len(batch[1]) for batch in iterable)
    return sum(1 for _ in iterable)


def libraries() -> dict[str, Any]:
    import webdataset

    import wdsx

    return {"wdsx": wdsx, "webdataset": webdataset}


def rates(build: Callable, urls: list[str], batched: bool, repeats: int = 3) -> dict[str, float]:
    runs = {
        name: (lambda wds=wds: count_samples(build(wds, urls), batched)) for name, wds in libraries().items()
    }
    return compare(runs, repeats)


def python_calls_per_sample(urls: list[str], limit: int = 20_000) -> dict[str, float]:
    """Python-level function calls (and generator resumptions) per sample of raw iteration:
    a count, so machine noise does not affect it."""
    result = {}
    for name, wds in libraries().items():
        calls = [0]

        def profile(frame: Any, event: str, arg: Any, calls: list[int] = calls) -> None:
            if event == "call":
                calls[0] += 1

        iterator = iter(raw(wds, urls))
        next(iterator)
        sys.setprofile(profile)
        for _ in range(limit):
            next(iterator)
        sys.setprofile(None)
        result[name] = calls[0] / limit
    return result


def peak_rss_mb(urls: list[str]) -> dict[str, float]:
    """Peak resident memory (VmHWM, which unlike ru_maxrss is not inherited across fork and
    exec) of a fresh process iterating the shards raw."""
    result = {}
    for name in ("wdsx", "webdataset"):
        code = (
            "import json, warnings; warnings.filterwarnings('ignore')\n"
            f"import {name} as wds\n"
            f"n = sum(1 for _ in wds.WebDataset({urls!r}, shardshuffle=False))\n"
            "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
            "print(json.dumps({'mb': int(peak) / 1024, 'n': n}))"
        )
        result[name] = in_subprocess(code)["mb"]
    return result
