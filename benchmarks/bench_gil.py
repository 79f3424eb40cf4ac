"""Which decoders release the GIL: the same images decoded on two threads at once.

Two threads of a decoder that releases the GIL while it works keep two cores busy: the
process's CPU time grows twice as fast as the wall clock. One that holds the GIL keeps one
core busy however many threads decode, and decoding on threads inside a worker cannot use
more than one core. CPU time over wall time is also what a busy machine disturbs least.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import bound


def busy_cores(payloads: Sequence[bytes], decode: Callable[[bytes], Any], threads: int = 2) -> float:
    """CPU seconds per wall second while ``threads`` threads each decode all ``payloads``."""

    def work() -> None:
        for data in payloads:
            decode(data)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    wall, cpu = time.perf_counter(), time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def gil_rows(repeats: int = 3) -> list[tuple[str, str, str, str, str]]:
    from benchmarks import images

    payloads = bound.field_bytes(images.photo_shards()[:1], "jpg")[:200]
    decoders = {"simplejpeg": bound.simplejpeg_rgb, "Pillow": bound.pillow_rgb}
    found = {
        name: statistics.median(busy_cores(payloads, decode) for _ in range(repeats))
        for name, decode in decoders.items()
    }
    return [
        (
            f"cores busy while 2 threads decode, {name} (500x375 JPEGs)",
            f"{cores:.2f}",
            "",
            "releases the GIL" if cores > 1.5 else "holds the GIL",
            "",
        )
        for name, cores in found.items()
    ]
