"""Maps whose functions may draw from their item's own generator: ``rng=True``.

``.map_tuple(augment, None, rng=True)`` applies ``augment`` to each tuple's first element as
``map_tuple`` does, and while it runs, ``wdsx.current_rng()`` is that item's generator
(:mod:`wdsx.pipeline.randomness`). The seed comes from where the item was read, which a tuple
no longer says, so it comes from the pipeline's side channels instead:

* live, from ``run.position``, which every stage keeps pointing at the item it yields;
* while a restored buffer replays re-read samples through the stages before it, from the
  sample itself: a :class:`RememberSample` stage, placed right after the reader, notes each
  replayed sample's position and epoch seed before later stages turn it into a tuple (replay
  takes one sample through all the stages before the next, so the note is the right one).

Both give the same seed, so a checkpoint resumes with the same draws, and the draws are
independent of topology, of what was read before, and of other random maps (each stage mixes
its index into the seed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from wdsx.pipeline import randomness
from wdsx.stages.base import Count, Run, Stage, source_index
from wdsx.stages.transforms import Transform


class RememberSample(Stage):
    """Right after the reader: passes items through untouched, and while a buffer is being
    restored notes each replayed sample for the random maps after it."""

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return upstream

    def replay(self, item: Any) -> Any:
        randomness.remember_replayed(item)
        return item

    def count_after(self, count: Count) -> Count:
        return count

    def describe(self) -> str:
        return "remember_sample"


class RandomTransform(Transform):
    """A :class:`~wdsx.stages.transforms.Transform` whose function runs with
    ``wdsx.current_rng()`` set to its item's generator; ``salt`` (the stage's index) keeps two
    random maps of one pipeline from drawing the same numbers."""

    def __init__(self, transform: Transform, salt: int):
        super().__init__(transform.fn, f"{transform.label} with rng", transform.handler)
        self.salt = salt

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        live = copy.copy(self)
        live.fn = LiveDraws(self.fn, run, self.salt)
        return Transform.apply(live, upstream, run, index)

    def replay(self, item: Any) -> Any:
        epoch_seed, position = randomness.replayed_sample()
        return _call_drawing(self.fn, item, randomness.ItemDraws(epoch_seed, position, self.salt))

    def describe(self) -> str:
        return f"{self.label}[salt={self.salt}]"


class LiveDraws:
    """``fn`` run with the generator of the item at ``run.position``."""

    __slots__ = ("fn", "run", "salt")

    def __init__(self, fn: Callable[[Any], Any], run: Run, salt: int):
        self.fn = fn
        self.run = run
        self.salt = salt

    def __call__(self, item: Any) -> Any:
        run = self.run
        return _call_drawing(self.fn, item, randomness.ItemDraws(run.epoch_seed, run.position, self.salt))


def _call_drawing(fn: Callable[[Any], Any], item: Any, draws: randomness.ItemDraws) -> Any:
    token = randomness.drawing(draws)
    try:
        return fn(item)
    finally:
        randomness.done_drawing(token)


def with_item_rng(pipeline: Any, transform: Transform) -> Any:
    """A copy of ``pipeline`` (a wdsx pipeline) with ``transform`` appended as a random map,
    and a :class:`RememberSample` right after its reader unless one is there already."""
    result = pipeline.compose(RandomTransform(transform, len(pipeline.pipeline)))
    stages = result.pipeline
    source = source_index(stages)
    if source is not None and not any(isinstance(stage, RememberSample) for stage in stages):
        stages.insert(source + 1, RememberSample())
        stages[-1] = RandomTransform(transform, len(stages) - 1)
    return result
