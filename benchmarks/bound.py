"""The bound of a decoding pipeline: its decoder alone, on the same encoded bytes already in
memory, in the same number of processes. No loader can do less work than that, so a loader's
rate divided by this one says how much of the machine goes to anything but decoding. The
same pipeline iterated directly in as many processes, with no loader (:func:`pipeline_rate`),
tells the pipeline's own costs (reading, grouping, batching) from the loader's.
"""

from __future__ import annotations

import functools
import multiprocessing
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def field_bytes(urls: Sequence[str], field: str) -> list[bytes]:
    """Every sample's ``field`` from the shards, in shard order (read with wdsx, raw)."""
    import wdsx

    return [sample[field] for sample in wdsx.WebDataset(list(urls), shardshuffle=False)]


def simplejpeg_rgb(data: bytes) -> Any:
    """What ``decode("rgb8")`` runs on a JPEG: simplejpeg to an RGB array."""
    import simplejpeg

    return simplejpeg.decode_jpeg(data, colorspace="RGB")


def simplejpeg_rgb_batch(payloads: Sequence[bytes]) -> Any:
    """The same decoder writing each image into its slot of one new batch array, as a loader
    that hands out batches of decoded images must: the images land in memory that is not in
    the CPU's cache, where :func:`simplejpeg_rgb` in a loop rewrites one array that stays there."""
    import numpy as np
    import simplejpeg

    height, width, _, _ = simplejpeg.decode_jpeg_header(payloads[0])
    batch = np.empty((len(payloads), height, width, 3), dtype=np.uint8)
    for slot, data in zip(batch, payloads):
        simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=slot)
    return batch


def pillow_rgb(data: bytes) -> Any:
    """What ``decode("pil")`` runs: Pillow opens and loads, and converts to RGB an image in
    another mode (an RGB image needs no copy)."""
    import io

    import PIL.Image

    with io.BytesIO(data) as stream:
        image = PIL.Image.open(stream)
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")


def _decode_share(payloads: Sequence[bytes], decode: Callable[[bytes], Any], index: int, of: int) -> None:
    for data in payloads[index::of]:
        decode(data)


def _batch_share(
    payloads: Sequence[bytes], decode: Callable[[Sequence[bytes]], Any], size: int, index: int, of: int
) -> None:
    share = payloads[index::of]
    for start in range(0, len(share), size):
        decode(share[start : start + size])


def _pipeline_share(
    urls: Sequence[str], build: Callable[[list[str]], Iterable[Any]], index: int, of: int
) -> None:
    for _ in build(list(urls[index::of])):
        pass


def _run_share(work: Callable[[int, int], None], start: Any, done: Any, index: int, of: int) -> None:
    start.wait()
    work(index, of)
    done.put(index)


def parallel_rate(items: int, work: Callable[[int, int], None], processes: int) -> float:
    """Items per second of ``processes`` forked processes, each running ``work(index,
    processes)`` (its share of ``items``), timed from a common start signal to the last one's
    end (process start-up not included)."""
    context = multiprocessing.get_context("fork")
    start, done = context.Event(), context.Queue()
    workers = [
        context.Process(target=_run_share, args=(work, start, done, index, processes))
        for index in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.2)  # let them reach the start line
    began = time.perf_counter()
    start.set()
    for _ in workers:
        done.get()
    elapsed = time.perf_counter() - began
    for worker in workers:
        worker.join()
    return items / elapsed


def decode_rate(payloads: Sequence[bytes], decode: Callable[[bytes], Any], processes: int) -> float:
    """Items per second of ``processes`` forked processes decoding a share of ``payloads`` each."""
    return parallel_rate(len(payloads), functools.partial(_decode_share, payloads, decode), processes)


def batch_decode_rate(
    payloads: Sequence[bytes], decode: Callable[[Sequence[bytes]], Any], processes: int, size: int
) -> float:
    """Items per second of ``processes`` forked processes, each decoding its share of
    ``payloads`` in batches of ``size`` with ``decode(batch_payloads)``."""
    return parallel_rate(len(payloads), functools.partial(_batch_share, payloads, decode, size), processes)


def pipeline_rate(
    urls: Sequence[str], items: int, build: Callable[[list[str]], Iterable[Any]], processes: int
) -> float:
    """Items per second of the pipeline ``build(shards)`` iterated directly, with no loader, in
    ``processes`` forked processes, each over every ``processes``-th shard: the work of a
    loader's workers without the loader's own (``items``: the samples of all the shards)."""
    return parallel_rate(items, functools.partial(_pipeline_share, urls, build), processes)


def mean_decode_ms(payloads: Sequence[bytes], decode: Callable[[bytes], Any], limit: int = 500) -> float:
    """Milliseconds per item of ``decode`` in this process (for profiles)."""
    sample = list(payloads[:limit])
    began = time.perf_counter()
    for data in sample:
        decode(data)
    return 1000 * (time.perf_counter() - began) / len(sample)


__all__ = [
    "batch_decode_rate",
    "decode_rate",
    "field_bytes",
    "mean_decode_ms",
    "parallel_rate",
    "pillow_rgb",
    "pipeline_rate",
    "simplejpeg_rgb",
    "simplejpeg_rgb_batch",
]
