"""WebLoader pipelines as users run them: wdsx, webdataset and the bound, in one run.

Each case is a pipeline written once as a function of the library module (``wds``) and run
end to end through ``WebLoader`` with both libraries; its *bound* is the pipeline's decoder
alone on the same encoded bytes, already in memory, in as many processes as the loader has
workers (:mod:`benchmarks.bound`): the work no loader can skip. The three are measured in
turn, ``repeats`` times, and the medians reported, with the CPU time each spent per sample
(workers and main process together), which a busy machine disturbs far less than rates.
"""

from __future__ import annotations

import functools
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import PIL.Image

from benchmarks import bound
from benchmarks.bench_read import libraries

BATCH = 64
"""The rgb8 pipelines' batch size."""
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


def tutorial_work(data: bytes) -> Any:
    """The work of the tutorial pipeline that no loader can skip: Pillow's decode and the
    user's transform."""
    return tutorial_transform(bound.pillow_rgb(data))


def rgb8_pipeline(wds: Any, urls: list[str]) -> Any:
    """The rgb8 case's pipeline, which its loaders run in their workers."""
    dataset = wds.WebDataset(urls, shardshuffle=False).shuffle(1000).decode("rgb8")
    return dataset.to_tuple("jpg", "cls").batched(BATCH)


def rgb8_loader(
    wds: Any, urls: list[str], workers: int = 2, threads: int = 1, worker_type: str = "process"
) -> Any:
    """``threads``: decoding threads per worker; ``worker_type="thread"``: reader threads as
    the workers (wdsx only)."""
    options: dict[str, Any] = {"decode_threads": threads} if threads > 1 else {}
    if worker_type != "process":
        options["worker_type"] = worker_type
    return wds.WebLoader(rgb8_pipeline(wds, urls), batch_size=None, num_workers=workers, **options)


def decode_first_loader(wds: Any, urls: list[str]) -> Any:
    """The same with the shuffle after decoding (its buffer holds decoded images)."""
    dataset = wds.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls").shuffle(1000)
    return wds.WebLoader(dataset.batched(64), batch_size=None, num_workers=2)


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


def photo_crop_loader(wds: Any, urls: list[str], scaled: bool | float = True) -> Any:
    """The ImageNet-like pipeline: RandomResizedCrop to 224 and a flip, batches of 64. wdsx
    decodes straight to the crop (``scaled``: its scaled decoding); webdataset users decode to
    PIL and crop and flip in a map, as torchvision's transforms do on PIL images."""
    dataset = wds.WebDataset(urls, shardshuffle=False).shuffle(1000)
    if wds.__name__ == "wdsx":
        dataset = dataset.decode_resized(224, flip=True, scaled_decoding=scaled)
    else:
        dataset = dataset.decode("pil").map_dict(jpg=pil_random_resized_crop)
    return wds.WebLoader(dataset.to_tuple("jpg", "cls").batched(64), batch_size=None, num_workers=2)


def pil_random_resized_crop(image: PIL.Image.Image) -> np.ndarray:
    """torchvision's RandomResizedCrop(224) and RandomHorizontalFlip on a PIL image, to an
    array (the box drawn with torchvision's algorithm as wdsx implements it)."""
    from wdsx.codecs.scaled import random_resized_box

    seed = random.getrandbits(64)
    box = random_resized_box(seed, image.height, image.width, (0.08, 1.0), (3 / 4, 4 / 3))
    region = (box.left, box.top, box.left + box.width, box.top + box.height)
    image = image.resize((224, 224), PIL.Image.Resampling.BILINEAR, box=region)
    if seed & 1:
        image = image.transpose(PIL.Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)


@dataclass
class Case:
    """WebLoader rows measured together: loaders by name, and the bound's decoder."""

    loaders: dict[str, Callable[[], Any]]
    urls: list[str]
    field: str
    decode: Callable[[bytes], Any]
    processes: int
    work: Callable[[bytes], Any] | None = None
    """Where the pipeline runs user code per sample: the decoder and that code, measured like
    the bound (as ``"decode + transform"``), since no loader can skip that either."""
    decode_batch: Callable[[Sequence[bytes]], Any] | None = None
    """The decoder writing into batch arrays of the pipeline's size, as delivering batches
    needs (as ``"decoder into batches"``): the part of the gap to the bound that is memory,
    not the loader."""
    pipeline: Callable[[list[str]], Any] | None = None
    """wdsx's pipeline of the case, iterated directly in as many processes with no loader (as
    ``"pipeline alone"``): what the loader's own work adds is the difference."""


@dataclass
class Measured:
    rates: dict[str, float] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    first_batch_s: dict[str, float] = field(default_factory=dict)


def cpu_seconds() -> float:
    """CPU seconds of this process and of its children that have ended and been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_loader(loader: Callable[[], Any]) -> tuple[int, float, float, float]:
    """Samples, seconds, seconds to the first batch and CPU seconds of one pass (building the
    loader included); the batch's last element is the label column."""
    cpu = cpu_seconds()
    start = time.perf_counter()
    first = None
    count = 0
    for batch in loader():
        if first is None:
            first = time.perf_counter() - start
        count += len(batch[-1])
    return count, time.perf_counter() - start, first or 0.0, cpu_seconds() - cpu


def measure(case: Case, repeats: int) -> Measured:
    """Medians over ``repeats`` interleaved passes of each loader and of each reference: the
    bound, and where the case has them, its decoder with the user's transform and its pipeline
    with no loader."""
    payloads = bound.field_bytes(case.urls, case.field)
    references = {"bound": case.decode, **({"decode + transform": case.work} if case.work else {})}
    rates: dict[str, Callable[[], float]] = {
        name: functools.partial(bound.decode_rate, payloads, work, case.processes)
        for name, work in references.items()
    }
    if case.decode_batch is not None:
        rates["decoder into batches"] = functools.partial(
            bound.batch_decode_rate, payloads, case.decode_batch, case.processes, BATCH
        )
    if case.pipeline is not None:
        rates["pipeline alone"] = functools.partial(
            bound.pipeline_rate, case.urls, len(payloads), case.pipeline, case.processes
        )
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in (*case.loaders, *rates)}
    for _ in range(repeats):
        for name, loader in case.loaders.items():
            count, seconds, first, cpu = run_loader(loader)
            runs[name].append((count / seconds, 1000 * cpu / count, first))
        for name, rate in rates.items():
            cpu = cpu_seconds()
            runs[name].append((rate(), 1000 * (cpu_seconds() - cpu) / len(payloads), 0.0))
    result = Measured()
    for name, values in runs.items():
        result.rates[name] = statistics.median(v[0] for v in values)
        result.cpu_ms[name] = statistics.median(v[1] for v in values)
        result.first_batch_s[name] = statistics.median(v[2] for v in values)
    return result


def cases() -> dict[str, Case]:
    """Every WebLoader case, on its shards."""
    from benchmarks import data, images

    modules = libraries()
    jpeg, clipart, photos = data.jpeg_shards(), images.clipart_shards(), images.photo_shards()

    def both(build: Callable[[Any, list[str]], Any], urls: list[str]) -> dict[str, Callable[[], Any]]:
        return {name: (lambda wds=wds: build(wds, urls)) for name, wds in modules.items()}

    wdsx, webdataset = modules["wdsx"], modules["webdataset"]
    return {
        "rgb8": Case(
            {
                **both(rgb8_loader, jpeg),
                "wdsx 1 worker x 2 threads": lambda: rgb8_loader(wdsx, jpeg, 1, 2),
                "wdsx 2 thread workers": lambda: rgb8_loader(wdsx, jpeg, 2, worker_type="thread"),
            },
            jpeg,
            "jpg",
            bound.simplejpeg_rgb,
            2,
            decode_batch=bound.simplejpeg_rgb_batch,
            pipeline=lambda urls: rgb8_pipeline(wdsx, urls),
        ),
        "decode first": Case(both(decode_first_loader, jpeg), jpeg, "jpg", bound.simplejpeg_rgb, 2),
        "tutorial": Case(
            both(tutorial_loader, clipart), clipart, "input.jpg", bound.pillow_rgb, 4, tutorial_work
        ),
        "photo": Case(
            {
                "wdsx": lambda: photo_crop_loader(wdsx, photos, False),
                "wdsx scaled": lambda: photo_crop_loader(wdsx, photos, True),
                "wdsx scaled 0.5": lambda: photo_crop_loader(wdsx, photos, 0.5),
                "webdataset": lambda: photo_crop_loader(webdataset, photos),
            },
            photos,
            "jpg",
            bound.simplejpeg_rgb,
            2,
        ),
    }


Row = tuple[str, str, str, str, str]


def _rate(value: float) -> str:
    return f"{value:,.0f} /s"


def _against(measured: Measured, name: str, other: str = "webdataset") -> str:
    """Rate ratio to ``other``, CPU time per sample ratio, and the fraction of the bound."""
    rates, cpu = measured.rates, measured.cpu_ms
    return (
        f"{rates[name] / rates[other]:.2f}x (CPU per sample {cpu[other] / cpu[name]:.2f}x less); "
        f"bound {_rate(rates['bound'])}: {rates[name] / rates['bound']:.2f} of it "
        f"(CPU per sample: {cpu['bound'] / cpu[name]:.2f})"
    )


def loader_rows(repeats: int) -> list[Row]:
    """The WebLoader rows of ``make bench``: each with webdataset and its bound, in one run."""
    rows: list[Row] = []
    named = {
        "rgb8": "WebLoader(2): shuffle(1000).decode(rgb8).to_tuple.batched(64)",
        "decode first": "WebLoader(2): decode(rgb8).to_tuple.shuffle(1000).batched(64)",
        "tutorial": "tutorial: WebLoader(4): shuffle.decode(pil).to_tuple.map_tuple.batched(32), clipart",
    }
    targets = {"rgb8": ">= 2.5x, >= 0.8 of bound", "decode first": ">= 2.5x", "tutorial": ">= 1.3x"}
    for key, case in cases().items():
        print(f"#   {key}...", file=sys.stderr, flush=True)
        measured = measure(case, repeats)
        rates = measured.rates
        if key in named:
            ratio = _against(measured, "wdsx")
            rows.append((named[key], _rate(rates["wdsx"]), _rate(rates["webdataset"]), ratio, targets[key]))
        if key == "rgb8":
            threads = rates["wdsx 1 worker x 2 threads"]
            rows.append(
                (
                    "... the same, WebLoader(num_workers=1, decode_threads=2)",
                    _rate(threads),
                    _rate(rates["webdataset"]),
                    f"{threads / rates['wdsx']:.2f} of 2 workers' rate; "
                    + _against(measured, "wdsx 1 worker x 2 threads"),
                    "",
                )
            )
            thread_workers = rates["wdsx 2 thread workers"]
            rows.append(
                (
                    '... the same, WebLoader(num_workers=2, worker_type="thread")',
                    _rate(thread_workers),
                    _rate(rates["webdataset"]),
                    f"{thread_workers / rates['wdsx']:.2f} of 2 worker processes' rate; "
                    + _against(measured, "wdsx 2 thread workers"),
                    "",
                )
            )
            batches, cpu = rates["decoder into batches"], measured.cpu_ms
            into = cpu["decoder into batches"]
            rows.append(
                (
                    f"... the decoder alone writing into {BATCH}-image batch arrays, 2 processes",
                    _rate(batches),
                    "",
                    f"CPU per sample {into / cpu['bound']:.2f}x the bound's: writing to memory "
                    f"outside the cache; WebLoader(2) at {into / cpu['wdsx']:.2f} of this, 2 thread "
                    f"workers at {into / cpu['wdsx 2 thread workers']:.2f} (in CPU per sample)",
                    "",
                )
            )
            alone = rates["pipeline alone"]
            rows.append(
                (
                    "... the same pipeline iterated in 2 processes, no loader (wdsx)",
                    _rate(alone),
                    "",
                    f"bound {_rate(rates['bound'])}: {alone / rates['bound']:.2f} of it (CPU per "
                    f"sample: {cpu['bound'] / cpu['pipeline alone']:.2f}); CPU per sample of "
                    f"WebLoader(2) {cpu['wdsx'] / cpu['pipeline alone']:.2f}x this, of 2 thread "
                    f"workers {cpu['wdsx 2 thread workers'] / cpu['pipeline alone']:.2f}x",
                    "",
                )
            )
        if key == "tutorial":
            work, cpu = rates["decode + transform"], measured.cpu_ms
            rows.append(
                (
                    "tutorial: Pillow's decode and the user's transform alone, 4 processes",
                    f"{rates['wdsx'] / work:.2f} of it",
                    f"{rates['webdataset'] / work:.2f} of it",
                    f"{_rate(work)} (CPU {cpu['decode + transform']:.2f} ms per sample; wdsx "
                    f"{cpu['wdsx']:.2f}, webdataset {cpu['webdataset']:.2f}): no loader can beat "
                    f"webdataset by more than {work / rates['webdataset']:.2f}x here",
                    "",
                )
            )
            first = measured.first_batch_s
            rows.append(
                (
                    "tutorial: time to the first batch",
                    f"{1000 * first['wdsx']:.0f} ms",
                    f"{1000 * first['webdataset']:.0f} ms",
                    f"{first['wdsx'] / first['webdataset']:.2f}x",
                    "<= 1x",
                )
            )
        if key == "photo":
            full = rates["wdsx"]
            rows.append(
                (
                    "ImageNet-like: RandomResizedCrop(224)+flip, full-size decode",
                    _rate(full),
                    _rate(rates["webdataset"]),
                    _against(measured, "wdsx"),
                    "",
                )
            )
            for variant, floor in (("wdsx scaled", "1"), ("wdsx scaled 0.5", "0.5")):
                rows.append(
                    (
                        f"ImageNet-like, scaled decoding (scaled_decoding={floor})",
                        _rate(rates[variant]),
                        _rate(rates["webdataset"]),
                        f"{rates[variant] / full:.2f}x the full-size decode (CPU per sample "
                        f"{measured.cpu_ms['wdsx'] / measured.cpu_ms[variant]:.2f}x less)",
                        ">= 2x full-size" if floor == "1" else "",
                    )
                )
    return rows
