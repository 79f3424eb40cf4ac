"""Decoding a batch's images straight into the batch's array.

Decoding images one by one and then collating them writes every pixel twice: once when each
image is decoded into an array of its own, once when the arrays are stacked into the batch.
Here a decoder leaves image fields encoded (:class:`Deferred`), and once the batch is known,
:func:`stack` decodes each column of images into one array: JPEGs for ``rgb8`` straight into
their slot, any other image into its own array and then into its slot. The result equals
decoding one by one and stacking, value for value.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeGuard

import numpy as np

from wdsx.codecs.decode import Decoder, ImageHandler, ResolvedHandler

Allocate = Callable[[tuple[int, ...], Any], np.ndarray]


class Deferred:
    """An image field whose decoding is left to the batch it ends up in."""

    __slots__ = ("data", "decode", "decode_into")

    def __init__(
        self,
        data: bytes,
        decode: Callable[[bytes], Any],
        decode_into: Callable[[bytes, np.ndarray], bool] | None,
    ):
        self.data = data
        self.decode = decode
        self.decode_into = decode_into

    def value(self) -> Any:
        """The field decoded on its own, as the decoder would have returned it."""
        return self.decode(self.data)


class _Deferring(ResolvedHandler):
    """Wraps an image handler whose results are arrays or tensors: its fields become
    :class:`Deferred` instead of being decoded."""

    def __init__(self, handler: ImageHandler):
        self.handler = handler

    def decoder_for(self, key: str) -> Callable[[bytes], Any] | None:
        decode = self.handler.decoder_for(key)
        if decode is None:
            return None
        decode_into = self.handler.into_decoder_for(key)
        return lambda data: Deferred(data, decode, decode_into)


def defers(handler: Any) -> TypeGuard[ImageHandler]:
    """Whether ``handler``'s results can be decoded into a batch (arrays or tensors, not PIL)."""
    return isinstance(handler, ImageHandler) and handler.atype != "pil"


def deferring(decoder: Decoder) -> Decoder:
    """A copy of ``decoder`` that returns image fields as :class:`Deferred` where
    :func:`defers` says so, and decodes every other field as ``decoder`` does."""
    result = copy.copy(decoder)
    result.handlers = [_Deferring(h) if defers(h) else h for h in decoder.handlers]
    result._plans = {}
    return result


class Threads:
    """``count`` decoding threads: one pool per process and count, made on first use."""

    _pools: dict[tuple[int, int], ThreadPoolExecutor] = {}

    def __init__(self, count: int):
        self.count = count

    def map(self, fn: Callable[..., bool], *iterables: Sequence[int]) -> Iterator[bool]:
        key = (os.getpid(), self.count)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = ThreadPoolExecutor(self.count, thread_name_prefix="wdsx-decode")
        return pool.map(fn, *iterables)


def stack(column: Sequence[Deferred], allocate: Allocate, threads: Threads | None = None) -> Any:
    """The column's images decoded into one batch array (a tensor when the decoder makes
    tensors), allocated with ``allocate``; None when they do not share one shape and type
    (collating them one by one then raises what it raises). With ``threads``, the images
    after the first are decoded on its threads, a contiguous share each (simplejpeg and
    Pillow release the GIL while they decode)."""
    first = column[0].value()
    is_tensor = not isinstance(first, np.ndarray)
    head = first.numpy() if is_tensor else first
    if not isinstance(head, np.ndarray):
        return None
    out = allocate((len(column), *head.shape), head.dtype)
    out[0] = head

    def fill(start: int, stop: int) -> bool:
        for slot, field in zip(out[start:stop], column[start:stop]):
            if field.decode_into is not None and field.decode_into(field.data, slot):
                continue
            value = field.value()
            array = value.numpy() if is_tensor else value
            if not isinstance(array, np.ndarray) or array.shape != head.shape or array.dtype != head.dtype:
                return False
            slot[...] = array
        return True

    if threads is None:
        filled = fill(1, len(column))
    else:
        shares = max(1, min(len(column) - 1, threads.count))
        bounds = [1 + (len(column) - 1) * k // shares for k in range(shares + 1)]
        filled = all(threads.map(fill, bounds[:-1], bounds[1:]))
    if not filled:
        return None
    if is_tensor:
        import torch

        return torch.from_numpy(out)
    return out
