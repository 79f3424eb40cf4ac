"""``decode`` → ``to_tuple``/``rename`` → ``batched``, run as one stage that decodes each
batch's images straight into the batch's array.

The pipeline runs this stage in place of those three when it can (:mod:`wdsx.stages.plan`).
It is a ``batched`` stage whose collation takes the samples as the reader made them: it
decodes their fields with the same decoder, except that images are left encoded until the
batch is known (:mod:`wdsx.codecs.batchdecode`); then each column of images is decoded into
one array, allocated where the batch will travel (:mod:`wdsx.core.allocate`). Anything this
path cannot do the same way — images of different sizes, a field that fails to decode, dicts
with different fields — sends the batch through the stages one by one instead, which gives
the result, or raises the error, that they give.

Its checkpoint is ``batched``'s: the positions of the samples it holds, which on restore are
re-read and need no replay of the decoding stages folded into it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from wdsx.codecs import batchdecode
from wdsx.core import allocate
from wdsx.stages.batch import Batched
from wdsx.stages.collate import default_collation_fn
from wdsx.stages.transforms import Transform, cheapest_call


class _Undeferred(Exception):
    """A batch the deferred path does not build exactly as the stages would."""


class DecodeBatched(Batched):
    """``decode`` followed by ``structural`` transforms and ``batched``, in one stage."""

    def __init__(self, decode: Transform, between: Sequence[Transform], batched: Batched, threads: int = 1):
        super().__init__(batched.batchsize, self._collate_samples, batched.partial)
        self.threads = batchdecode.Threads(threads) if threads > 1 else None
        self.stages = [decode, *between]
        self.decoder = batchdecode.deferring(decode.fn)  # type: ignore[arg-type]
        self.picks = [cheapest_call(stage.fn) for stage in between]
        self.label = " + ".join(stage.describe() for stage in (*self.stages, batched))

    def describe(self) -> str:
        return self.label

    def _collate_samples(self, samples: list) -> Any:
        try:
            return self._decoded_into_batch(samples)
        except Exception:
            items = samples
            for stage in self.stages:
                items = list(stage(items))
            return default_collation_fn(items)

    def _decoded_into_batch(self, samples: list) -> Any:
        items = []
        for sample in samples:
            item = self.decoder(sample)
            for pick in self.picks:
                item = pick(item)
            items.append(item)
        first = items[0]
        if isinstance(first, dict):
            if any(set(item) != set(first) for item in items):
                raise _Undeferred("samples with different fields")
            return {key: self._column([item[key] for item in items]) for key in first}
        return tuple(self._column(list(column)) for column in zip(*items))

    def _column(self, values: list) -> Any:
        """One column of the batch: images decoded into one array, anything else collated as
        ``batched`` collates it."""
        if not all(isinstance(value, batchdecode.Deferred) for value in values):
            values = [value.value() if isinstance(value, batchdecode.Deferred) else value for value in values]
            return default_collation_fn([(value,) for value in values])[0]
        stacked = batchdecode.stack(values, allocate.empty, self.threads)
        if stacked is None:
            raise _Undeferred("images of different shapes")
        return stacked
