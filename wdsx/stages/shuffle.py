"""Buffer shuffle whose state can be checkpointed and restored exactly.

Same behaviour as webdataset's ``shuffle(bufsize, initial)``: fill a buffer, then emit a
random element for each one added (:func:`pick`). Where webdataset's choices are a pure
function of a seed, wdsx makes the same ones:

- ``shuffle(n, seed=s)`` draws from a ``random.Random(s)`` made afresh each epoch, in every
  reader, as webdataset does (so the same input gives the same order every epoch);
- ``detshuffle(n, seed=s, epoch=e)`` seeds it with ``s + e + 1 + epoch`` for the pipeline's
  epoch ``0, 1, ...``, as webdataset's stage counts its runs from ``e + 1``.

That generator is a :class:`~wdsx.core.rng.CountingRandom`, so the checkpoint holds the number
of words it drew, and restoring re-seeds it and skips them. Without a seed (webdataset's order
then depends on the time), the choices come from a counter-based stream seeded by (pipeline
seed, epoch, reader, stage), whose state is the number of draws. Either way the checkpoint
also holds the positions of the buffered samples, which restoring reads again.

Checkpoints written before seeded shuffles followed webdataset hold no word count: such a
shuffle finishes the epoch it was saved in on the counter-based stream it was using.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from wdsx.core import rng
from wdsx.stages.base import Count, Run, Stage
from wdsx.stages.buffer import Buffer, attach_buffer
from wdsx.state import validate
from wdsx.state.checkpoint import JsonDict
from wdsx.state.position import PositionTable

Choose = Callable[[int], int]
"""Which of ``n`` held items to emit next: an index in ``range(n)``."""


def pick(buf: list, rng: Any) -> Any:
    """Remove and return a random item of ``buf`` (``rng.randint`` chooses; the last item
    takes its place): webdataset's step of a buffer shuffle, making the same draws."""
    k = rng.randint(0, len(buf) - 1)
    item = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return item


class ShuffleBuffer(Buffer):
    """A shuffle's :class:`~wdsx.stages.buffer.Buffer`, plus the words its seeded generator has
    drawn (None where it draws from the counter-based stream)."""

    __slots__ = ("words",)

    def __init__(self, positions: list[Any] | None = None, draws: int = 0, words: int | None = 0) -> None:
        super().__init__(positions, draws)
        self.words = words

    def to_json(self, table: PositionTable) -> JsonDict:
        data = super().to_json(table)
        if self.words is not None:
            data["words"] = self.words
        return data

    @classmethod
    def from_json(cls, data: JsonDict, table: PositionTable) -> ShuffleBuffer:
        buffer = Buffer.from_json(data, table)
        return cls(buffer.positions, buffer.draws, validate.optional_integer(data, "words", default=None))


class Shuffle(Stage):
    """Shuffle through a buffer of ``bufsize`` items, emitting once ``initial`` are held.

    ``rng`` draws from the caller's generator (not checkpointable); ``seed`` seeds a fresh
    ``random.Random`` each epoch; ``epoch`` (with ``seed``) makes it webdataset's detshuffle."""

    state_key = "shuffle"
    state_type = ShuffleBuffer

    def __init__(
        self,
        bufsize: int = 1000,
        initial: int = 100,
        rng: random.Random | None = None,
        seed: int | str | None = None,
        epoch: int | None = None,
    ):
        if rng is not None and seed is not None:
            raise ValueError("shuffle: pass rng= or seed=, not both")
        self.bufsize = bufsize
        self.initial = min(initial, bufsize)
        self.rng = rng
        self.seed = seed
        self.first_epoch = epoch
        """detshuffle's ``epoch`` argument, which its seeds count from."""
        self.epoch = epoch
        """As webdataset's detshuffle shows it: ``epoch`` plus the runs so far (set as each
        epoch starts, in the process that runs it; the seeds never read it)."""

    def count_after(self, count: Count) -> Count:
        return count

    def describe(self) -> str:
        return f"shuffle({self.bufsize}, initial={self.initial})"

    def not_resumable(self) -> str | None:
        if self.rng is not None:
            return "shuffle(rng=...) draws from a random.Random wdsx cannot checkpoint; pass seed= instead"
        return None

    def generator_seed(self, epoch: int) -> Any:
        """What webdataset seeds its ``random.Random`` with in the pipeline's ``epoch``
        (None when its order is not a function of a seed)."""
        if self.seed is None or self.rng is not None:
            return None
        if self.first_epoch is None:
            return self.seed
        return int(self.seed) + self.first_epoch + 1 + epoch

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        if self.first_epoch is not None:
            self.epoch = self.first_epoch + 1 + run.epoch
        buffer = cast(ShuffleBuffer, attach_buffer(run, index, kind=ShuffleBuffer))
        return self._shuffle(upstream, run, buffer, self._chooser(run, index, buffer))

    def _chooser(self, run: Run, index: int, buffer: ShuffleBuffer) -> Choose:
        """How this epoch picks, resuming where ``buffer``'s counts say."""
        if self.rng is not None:
            buffer.words = None
            generator = self.rng
            return lambda n: generator.randint(0, n - 1)
        seed = self.generator_seed(run.epoch)
        if seed is not None and buffer.words is not None:
            return _counted(seed, buffer.words, buffer)
        buffer.words = None
        base = run.seed if self.seed is None else self.seed
        # A shuffle of the shard list (before the reader) must give every rank and worker the
        # same order, or splitting it by rank or worker would read some shards twice.
        reader = 0 if run.before_source(index) else run.topology.consumer
        stream = rng.derive_seed("shuffle", base, run.epoch, reader, index)
        return lambda n: rng.below(stream, buffer.draws, n)

    def _shuffle(self, upstream: Iterator, run: Run, buffer: Buffer, choose: Choose) -> Iterator:
        # webdataset's loop (take one item, and a second while the buffer is not full; emit one
        # once ``initial`` are held; at the end, emit the rest), written as one loop so that
        # the hot path makes no call but ``choose``.
        items, positions = buffer.items, buffer.positions
        bufsize, initial = self.bufsize, self.initial
        while True:
            item = next(upstream, _END)
            if item is not _END:
                items.append(item)
                positions.append(run.position)
                if len(items) < bufsize:
                    item = next(upstream, _END)
                    if item is not _END:
                        items.append(item)
                        positions.append(run.position)
                if len(items) < initial:
                    continue
            elif not items:
                return
            k = choose(len(items))
            buffer.draws += 1
            item, run.position = items[k], positions[k]
            items[k], positions[k] = items[-1], positions[-1]
            items.pop()
            positions.pop()
            yield item


_END = object()
"""What ``next`` gives for an exhausted upstream."""


def _counted(seed: Any, words: int, buffer: ShuffleBuffer) -> Choose:
    """Draws from ``random.Random(seed)`` after its first ``words`` words, keeping
    ``buffer``'s count of the words drawn up to date."""
    generator = rng.CountingRandom(seed)
    generator.skip(words)

    def choose(n: int) -> int:
        k = generator.randint(0, n - 1)
        buffer.words = generator.words
        return k

    return choose


def shuffle(
    bufsize: int = 1000,
    initial: int = 100,
    rng: random.Random | None = None,
    seed: int | str | None = None,
    handler: object = None,
) -> Shuffle:
    """Buffer-shuffle the stream. With ``seed``, the order webdataset gives for that seed
    (the same each epoch); without, one derived from the pipeline's seed and epoch.
    ``handler`` is accepted and unused, as in webdataset."""
    return Shuffle(bufsize, initial, rng, seed)


class detshuffle(Shuffle):  # noqa: N801 - webdataset's name for this class
    """webdataset's deterministic shuffle: the order webdataset gives for ``seed + epoch + 1``
    in the pipeline's first epoch, ``seed + epoch + 2`` in the second, and so on. A class, as
    webdataset's is, so that code may subclass it or test for it with ``isinstance``."""

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1):
        super().__init__(bufsize, initial, None, seed, epoch)


@dataclass(frozen=True)
class ShardBufferShuffle:
    """webdataset's shard shuffle in ``WebDataset(urls, shardshuffle=n, seed=s)``: after the
    split by rank and worker, each reader passes its own shards through a shuffle buffer of
    ``n`` drawing from ``random.Random(s)``, so a reader gets the same order every epoch; with
    ``detshuffle=True`` (``per_epoch``) it draws from ``random.Random(s + epoch)``.

    Called with a reader's shard positions (in list order), the seed and the epoch, it returns
    them in that order: a pure function, so a resumed or re-dealt epoch finds the same order."""

    bufsize: int
    per_epoch: bool = False
    seed_text: str | None = None
    """The seed as text, when it was given so (``seed="7"``, or ``$WDS_SEED``): webdataset
    seeds ``random.Random`` with the text, which draws otherwise than the number. (With
    ``per_epoch``, the text of the number plus the epoch: webdataset cannot add the two.)"""

    def __call__(self, positions: list[int], seed: int, epoch: int) -> list[int]:
        value: int | str = seed + epoch if self.per_epoch else seed
        if self.seed_text is not None:
            value = str(value) if self.per_epoch else self.seed_text
        return list(Shuffle(self.bufsize, rng=random.Random(value))(positions))

    def __str__(self) -> str:
        epoch = ", seed + epoch" if self.per_epoch else ""
        text = "" if self.seed_text is None else f", seed {self.seed_text!r}"
        return f"buffer {self.bufsize}{epoch}{text}"
