"""webdataset's plain generator forms of its stages (``_map``, ``_select``, ``_shuffle``...) and
its currying classes, which programs import to build stages of their own.

``_map(data, f)`` is ``map(f)`` run over the iterator ``data``: each generator runs the wdsx
stage of the same name, so it behaves as that stage does (webdataset's ``_shuffle`` and
``pick`` with a seed or a seeded ``random.Random`` make webdataset's exact draws).
:class:`RestCurried` and :class:`FilterFunction` curry any such function as webdataset's
``pipelinefilter`` does: ``RestCurried(f)(*args)`` is a picklable function of an iterator.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdsx.core.errors import Handler, reraise_exception
from wdsx.stages import batch, transforms
from wdsx.stages.base import FilterFunction
from wdsx.stages.collate import default_collation_fn
from wdsx.stages.shuffle import Shuffle
from wdsx.stages.transforms import default_decoders


class RestCurried:
    """A function of an iterator and more arguments, waiting for those arguments: calling it
    with them gives a :class:`FilterFunction`."""

    def __init__(self, f: Callable):
        self.f = f

    def __call__(self, *args: Any, **kw: Any) -> FilterFunction:
        return FilterFunction(self.f, *args, **kw)


def _info(
    data: Iterable,
    fmt: str | None = None,
    n: int = 3,
    every: int = -1,
    width: int = 50,
    stream: Any = sys.stderr,
    name: str = "",
) -> Iterator:
    return transforms.info(fmt, n, every, width, stream, name)(data)


def _shuffle(
    data: Iterable,
    bufsize: int = 1000,
    initial: int = 100,
    rng: Any = None,
    seed: Any = None,
    handler: Handler | None = None,
) -> Iterator:
    return Shuffle(bufsize, initial, rng, seed)(data)


def _select(data: Iterable, predicate: Callable[[Any], bool]) -> Iterator:
    return transforms.select(predicate)(data)


def _log_keys(data: Iterable, logfile: str | None = None) -> Iterator:
    return transforms.log_keys(logfile)(data)


def _decode(data: Iterable, *args: Any, handler: Handler = reraise_exception, **kw: Any) -> Iterator:
    return transforms.decode(*args, handler=handler, **kw)(data)


def _map(data: Iterable, f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Iterator:
    return transforms.map(f, handler)(data)


def _rename(data: Iterable, handler: Handler = reraise_exception, keep: bool = True, **kw: str) -> Iterator:
    return transforms.rename(handler, keep, **kw)(data)


def _associate(data: Iterable, associator: Any, **kw: Any) -> Iterator:
    return transforms.associate(associator, **kw)(data)


def _map_dict(data: Iterable, handler: Handler = reraise_exception, **kw: Callable[[Any], Any]) -> Iterator:
    return transforms.map_dict(handler, **kw)(data)


def _to_tuple(
    data: Iterable,
    *args: str,
    handler: Handler = reraise_exception,
    missing_is_error: bool = True,
    none_is_error: bool | None = None,
) -> Iterator:
    return transforms.to_tuple(
        *args, handler=handler, missing_is_error=missing_is_error, none_is_error=none_is_error
    )(data)


def _map_tuple(
    data: Iterable, *args: Callable[[Any], Any] | None, handler: Handler = reraise_exception
) -> Iterator:
    return transforms.map_tuple(*args, handler=handler)(data)


def _batched(
    data: Iterable,
    batchsize: int = 20,
    collation_fn: Callable | None = default_collation_fn,
    partial: bool = True,
) -> Iterator:
    return batch.batched(batchsize, collation_fn, partial)(data)


def _unlisted(data: Iterable) -> Iterator:
    return batch.unlisted()(data)


def _unbatched(data: Iterable) -> Iterator:
    return batch.unbatched()(data)


def _rsample(data: Iterable, p: float = 0.5) -> Iterator:
    return transforms.rsample(p)(data)


def _extract_keys(
    source: Iterable, *patterns: str, duplicate_is_error: bool = True, ignore_missing: bool = False
) -> Iterator:
    return transforms.extract_keys(
        *patterns, duplicate_is_error=duplicate_is_error, ignore_missing=ignore_missing
    )(source)


def _rename_keys(
    source: Iterable,
    *args: tuple[str, str],
    keep_unselected: bool = False,
    must_match: bool = True,
    duplicate_is_error: bool = True,
    **kw: str,
) -> Iterator:
    return transforms.rename_keys(
        *args,
        keep_unselected=keep_unselected,
        must_match=must_match,
        duplicate_is_error=duplicate_is_error,
        **kw,
    )(source)


def _xdecode(
    source: Iterable,
    *args: tuple[str, Callable],
    must_decode: bool = True,
    defaults: list = default_decoders,
    **kw: Callable,
) -> Iterator:
    return transforms.xdecode(*args, must_decode=must_decode, defaults=defaults, **kw)(source)
