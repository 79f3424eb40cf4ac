"""webdataset's plain-function helpers: composing iterator functions and repeating a loader.

These work on ordinary iterators and functions, outside any pipeline object (the names live
in webdataset's ``filters`` and ``utils`` modules). Unlike webdataset 1.0.2, ``repeatedly``
stops when a pass over its source yields nothing (webdataset loops forever), and counts
samples with the ``batchsize`` function it is given (webdataset ignores that argument).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from itertools import islice
from typing import Any, TypeVar

T = TypeVar("T")


def identity(x: T) -> T:
    """Return the argument unchanged."""
    return x


class Composed:
    """``x -> g(f(x))`` as an object, not a closure, so that it pickles (when ``f`` and ``g``
    do) inside a pipeline sent to workers started with ``spawn``."""

    __slots__ = ("f", "g")

    def __init__(self, f: Callable, g: Callable):
        self.f = f
        self.g = g

    def __call__(self, x: Any) -> Any:
        return self.g(self.f(x))


def compose2(f: Callable, g: Callable) -> Callable:
    """The function ``x -> g(f(x))``."""
    return Composed(f, g)


def compose(*functions: Callable) -> Callable:
    """The functions applied left to right: ``compose(f, g, h)(x) == h(g(f(x)))``."""
    return functools.reduce(compose2, functions)


def pipeline(source: Any, *filters: Callable) -> Any:
    """``source`` passed through each filter (a function of an iterator) in turn."""
    return compose(*filters)(source) if filters else source


def guess_batchsize(batch: Any) -> int:
    """The number of samples in a batch: the length of its first element."""
    first: Sized = batch[0]
    return len(first)


def repeatedly0(loader: Iterable[T], nepochs: int = sys.maxsize, nbatches: int = sys.maxsize) -> Iterator[T]:
    """Up to ``nbatches`` items from each of ``nepochs`` passes over ``loader``."""
    for _ in range(nepochs):
        yield from islice(loader, nbatches)


def repeatedly(
    source: Iterable[T],
    nepochs: int | None = None,
    nbatches: int | None = None,
    nsamples: int | None = None,
    batchsize: Callable[[Any], int] = guess_batchsize,
) -> Iterator[T]:
    """Items from pass after pass over ``source``, until ``nepochs`` passes, ``nbatches``
    items or ``nsamples`` samples (items are batches; ``batchsize`` counts one) are reached,
    or a pass yields nothing."""
    epoch = batches = samples = 0
    while nepochs is None or epoch < nepochs:
        empty = True
        for item in source:
            empty = False
            yield item
            batches += 1
            if nbatches is not None and batches >= nbatches:
                return
            if nsamples is not None:
                samples += batchsize(item)
                if samples >= nsamples:
                    return
        if empty:
            return
        epoch += 1
