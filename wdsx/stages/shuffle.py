"""Buffer shuffle whose state can be checkpointed and restored exactly.

Same behaviour as webdataset's ``shuffle(bufsize, initial)``: fill a buffer, then emit a
random element for each one added. The random choices come from a counter-based stream
seeded by (seed, epoch, reader, stage), so the checkpoint only needs the draw count and the
positions of the buffered samples.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from wdsx.core import rng
from wdsx.stages.base import Count, Run, Stage
from wdsx.stages.buffer import Buffer, attach_buffer


class Shuffle(Stage):
    """Shuffle through a buffer of ``bufsize`` items, emitting once ``initial`` are held."""

    state_key = "shuffle"
    state_type = Buffer

    def __init__(
        self,
        bufsize: int = 1000,
        initial: int = 100,
        rng: random.Random | None = None,
        seed: int | None = None,
    ):
        self.bufsize = bufsize
        self.initial = min(initial, bufsize)
        self.rng = rng
        self.seed = seed

    def count_after(self, count: Count) -> Count:
        return count

    def describe(self) -> str:
        return f"shuffle({self.bufsize}, initial={self.initial})"

    def not_resumable(self) -> str | None:
        if self.rng is not None:
            return "shuffle(rng=...) draws from a random.Random wdsx cannot checkpoint; pass seed= instead"
        return None

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        buffer = attach_buffer(run, index)
        base = run.seed if self.seed is None else self.seed
        # A shuffle of the shard list (before the reader) must give every rank and worker the
        # same order, or splitting it by rank or worker would read some shards twice.
        reader = 0 if run.before_source(index) else run.topology.consumer
        seed = rng.derive_seed("shuffle", base, run.epoch, reader, index)
        return self._shuffle(upstream, run, buffer, seed)

    def _pick(self, buffer: Buffer, seed: int) -> tuple:
        items, positions = buffer.items, buffer.positions
        if self.rng is not None:
            k = self.rng.randint(0, len(items) - 1)
        else:
            k = rng.below(seed, buffer.draws, len(items))
        buffer.draws += 1
        items[k], items[-1] = items[-1], items[k]
        positions[k], positions[-1] = positions[-1], positions[k]
        return items.pop(), positions.pop()

    def _shuffle(self, upstream: Iterator, run: Run, buffer: Buffer, seed: int) -> Iterator:
        items, positions = buffer.items, buffer.positions
        bufsize, initial = self.bufsize, self.initial
        for item in upstream:
            items.append(item)
            positions.append(run.position)
            if len(items) < bufsize:
                try:
                    items.append(next(upstream))
                    positions.append(run.position)
                except StopIteration:
                    pass
            if len(items) >= initial:
                item, run.position = self._pick(buffer, seed)
                yield item
        while items:
            item, run.position = self._pick(buffer, seed)
            yield item


def shuffle(
    bufsize: int = 1000,
    initial: int = 100,
    rng: random.Random | None = None,
    seed: int | None = None,
    **_: object,
) -> Shuffle:
    """Buffer-shuffle the stream (deterministic given the pipeline seed and epoch)."""
    return Shuffle(bufsize, initial, rng, seed)


def detshuffle(bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1) -> Shuffle:
    """webdataset's deterministic shuffle; wdsx's shuffle is always deterministic per epoch."""
    return Shuffle(bufsize, initial, None, seed)
