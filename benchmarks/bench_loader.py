"""WebLoader pipelines as users run them: wdsx, webdataset and the bound, in one run.

Each case is a pipeline written once as a function of the library module (``wds``) and run
end to end through ``WebLoader`` with both libraries; its *bound* is the pipeline's decoder
alone on the same encoded bytes, already in memory, in as many processes as the loader has
workers (:mod:`benchmarks.bound`): the work no loader can skip. The three are measured in
turn, ``repeats`` times, and the medians reported, with the CPU time each spent per sample
(workers and main process together), which a busy machine disturbs far less than rates.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import PIL.Image

from benchmarks import bound
from benchmarks.bench_read import libraries

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def identity(x: Any) -> Any:
    return x


def tutorial_transform(image: PIL.Image.Image) -> Any:
    """The tutorial's torchvision transform without torchvision: resize to 224x224, to a float
    tensor in [0, 1], normalised with ImageNet's mean and deviation."""
    import torch

    array = np.asarray(image.resize((224, 224), PIL.Image.BILINEAR), dtype=np.float32)
    return torch.from_numpy((array.transpose(2, 0, 1) / 255 - MEAN) / STD)


def rgb8_loader(wds: Any, urls: list[str]) -> Any:
    dataset = wds.WebDataset(urls, shardshuffle=False).shuffle(1000).decode("rgb8")
    return wds.WebLoader(dataset.to_tuple("jpg", "cls").batched(64), batch_size=None, num_workers=2)


def tutorial_loader(wds: Any, urls: list[str]) -> Any:
    dataset = (
        wds.WebDataset(urls, shardshuffle=False)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("input.jpg", "target.pt")
        .map_tuple(tutorial_transform, identity)
        .batched(32, partial=False)
    )
    return wds.WebLoader(dataset, num_workers=4, batch_size=None)


@dataclass
class Case:
    """One WebLoader row: the pipeline, its shards, and its bound's decoder."""

    name: str
    build: Callable[[Any, list[str]], Any]
    urls: list[str]
    field: str
    decode: Callable[[bytes], Any]
    processes: int
    libraries: Sequence[str] = ("wdsx", "webdataset")


@dataclass
class Measured:
    rates: dict[str, float] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    first_batch_s: dict[str, float] = field(default_factory=dict)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_loader(loader: Callable[[], Any]) -> tuple[int, float, float, float]:
    """Samples, seconds, seconds to the first batch and CPU seconds of one pass; the batch's
    last element is the label column."""
    cpu = _cpu_seconds()
    start = time.perf_counter()
    first = None
    count = 0
    for batch in loader():
        if first is None:
            first = time.perf_counter() - start
        count += len(batch[-1])
    return count, time.perf_counter() - start, first or 0.0, _cpu_seconds() - cpu


def measure(case: Case, repeats: int) -> Measured:
    """Medians over ``repeats`` interleaved passes of each library and of the bound."""
    modules = libraries()
    payloads = bound.field_bytes(case.urls, case.field)
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in (*case.libraries, "bound")}
    for _ in range(repeats):
        for name in case.libraries:
            count, seconds, first, cpu = run_loader(lambda wds=modules[name]: case.build(wds, case.urls))
            runs[name].append((count / seconds, 1000 * cpu / count, first))
        cpu = _cpu_seconds()
        rate = bound.decode_rate(payloads, case.decode, case.processes)
        runs["bound"].append((rate, 1000 * (_cpu_seconds() - cpu) / len(payloads), 0.0))
    result = Measured()
    for name, values in runs.items():
        result.rates[name] = statistics.median(v[0] for v in values)
        result.cpu_ms[name] = statistics.median(v[1] for v in values)
        result.first_batch_s[name] = statistics.median(v[2] for v in values)
    return result
