"""The ``.npy`` surface: small arrays saved by ``np.save`` (format versions 1, 2 and 3, many
dtypes and shapes), their headers and data mutated, read by wdsx from a file (memory-mapped)
and from a stream of short reads.

The oracle is numpy's own reader: ``np.load(..., allow_pickle=False)``, after numpy's header
parser has said how many bytes the data needs (so that a header claiming terabytes is called
truncated rather than allocated). Each row must come back with the dtype, shape and bytes
``np.load`` gives, or the reading must end in a ``ShardError``. wdsx refuses some arrays numpy
reads (0-d arrays, Fortran order with rows that are not contiguous, rows of zero bytes): those
are ``strict``.
"""

from __future__ import annotations

import io
import math
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

import wdsx
from tests.fuzz import mutate
from tests.fuzz.memory import url_of
from tests.fuzz.outcomes import Reading, attempt, describe, first_failure
from tests.fuzz.surfaces import Functions, FuzzInput

DTYPES = ("<f4", ">f8", "<i2", "u1", "?", "<c8", "<u8", "S3", "<U2", "[('a', '<i4'), ('b', 'u1', (2,))]")
ROW_SHAPES = ((), (3,), (2, 2), (0,), (1, 5))
STEPS = (None, None, 1, 9, 64, 4096)
HEADER_EDITS = [
    (
        b"'shape': (",
        [
            b"'shape': (-1, ",
            b"'shape': (1099511627776, ",
            b"'shape': (",
            b"'shape': (0, ",
            b"'shape': (3, 3, 3, ",
            b"'shape': (2**40, ",
            b"'shape': (1.5, ",
        ],
    ),
    (
        b"'descr': '",
        [
            b"'descr': '|O",
            b"'descr': '<f0",
            b"'descr': 'V0",
            b"'descr': '<q9",
            b"'descr': '",
            b"'descr': '<M8[D]",
            b"'descr': 'xx",
        ],
    ),
    (b"'fortran_order': False", [b"'fortran_order': True", b"'fortran_order': 1", b"'fortran_order': None"]),
    (b"{", [b"{'extra': 1, ", b"{{", b"[", b"{'shape': (1,), "]),
]
"""Edits of a header's text: what to find, and what may replace it."""


def _array(rng: random.Random) -> np.ndarray:
    dtype = np.dtype(eval(dtype) if (dtype := rng.choice(DTYPES)).startswith("[") else dtype)  # noqa: S307
    shape = (rng.randint(0, 5), *rng.choice(ROW_SHAPES))
    data = rng.randbytes(dtype.itemsize * int(np.prod(shape)))
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    return np.asfortranarray(array) if rng.random() < 0.1 else array


def _saved(array: np.ndarray, version: tuple[int, int] | None) -> bytes:
    out = io.BytesIO()
    if version is None:
        np.save(out, array, allow_pickle=False)
    else:
        np.lib.format.write_array(out, array, version=version, allow_pickle=False)
    return out.getvalue()


def header_text(rng: random.Random, data: bytearray) -> bytearray:
    """Rewrite a part of the header's dictionary (shape, dtype, order, framing)."""
    find, replacements = rng.choice(HEADER_EDITS)
    at = data.find(find)
    if at >= 0:
        data[at : at + len(find)] = rng.choice(replacements)
    return data


def header_length(rng: random.Random, data: bytearray) -> bytearray:
    """Change the header-length field (2 bytes in version 1, 4 in versions 2 and 3)."""
    width = 2 if data[6:7] == b"\x01" else 4
    value = rng.choice([0, 1, 9, 64, 65535, 2**16, 2**31 - 1, 2**32 - 1, 4 << 30])
    data[8 : 8 + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    return data


def header_bytes(rng: random.Random, data: bytearray) -> bytearray:
    """Flip a bit of the magic, the version or the header text."""
    end = min(len(data), 10 + int.from_bytes(data[8:10], "little")) if len(data) > 10 else len(data)
    if end:
        data[rng.randrange(end)] ^= 1 << rng.randrange(8)
    return data


MUTATIONS = {
    "header_text": header_text,
    "header_length": header_length,
    "header_bytes": header_bytes,
    "bit_flips": mutate.bit_flips,
    "truncate": mutate.truncate,
    "append": mutate.append,
}


@dataclass(frozen=True)
class Input(FuzzInput):
    """One ``.npy`` fuzz input."""

    step: int | None
    original: np.ndarray


def make_input(seed: int, index: int) -> Input:
    rng = random.Random(f"npy:{seed}:{index}")
    array = _array(rng)
    version = rng.choice([None, None, (1, 0), (2, 0), (3, 0)])
    data = bytearray(_saved(array, version))
    names = rng.choices(sorted(MUTATIONS), k=rng.choice([0, 1, 1, 1, 2]))
    for name in names:
        data = MUTATIONS[name](rng, data)
    what = f"{array.dtype.str if array.dtype.fields is None else 'struct'}{list(array.shape)}"
    return Input(index, what, tuple(names) or ("none",), bytes(data), rng.choice(STEPS), array)


@dataclass(frozen=True)
class Expected:
    """``np.load``'s rows, or why it cannot give them."""

    rows: list[np.ndarray] | None
    reason: str = ""
    refusable: bool = False
    """Whether wdsx may refuse the array although numpy reads it (an array without rows of
    data, or a Fortran-ordered one)."""


def expected(data: bytes) -> Expected:
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in ((1, 0), (2, 0), (3, 0)):
            return Expected(None, f"format version {version}, which numpy does not read")
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(stream, max_header_size=1 << 16)
        if dtype.hasobject:
            return Expected(None, "an object array (numpy refuses it without allow_pickle)")
        if min(shape, default=0) < 0 or math.prod(shape) * dtype.itemsize > len(data) - stream.tell():
            return Expected(None, f"the data is shorter than the header's shape {shape} needs")
        if not shape or (shape[0] and dtype.itemsize * math.prod(shape[1:]) == 0):
            return Expected(None, f"shape {shape} of {dtype}: no rows of data", refusable=True)
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exn:  # numpy's reader is the oracle: whatever it refuses is damage
        return Expected(None, f"numpy refuses it: {type(exn).__name__}: {exn}")
    rows = [array[row, ...] for row in range(len(array))]  # arrays of the row's dtype, not scalars
    return Expected(rows, refusable=fortran and array.ndim > 1)


def _rows(dataset: Any) -> list[tuple[str, np.ndarray]]:
    return [(sample["__key__"], sample["npy"]) for sample in dataset]


def read_all_ways(item: Input, scratch: str) -> dict[str, Reading]:
    path = os.path.join(scratch, "input.npy")
    with open(path, "wb") as stream:
        stream.write(item.data)
    url = url_of(item.data, "input.npy", item.step)
    return {
        "file": attempt(
            lambda: _rows(wdsx.WebDataset(path, shardshuffle=False, manifest=False, empty_check=False))
        ),
        "memory": attempt(
            lambda: _rows(wdsx.WebDataset(url, shardshuffle=False, manifest=False, empty_check=False))
        ),
    }


def _same(found: list[tuple[str, np.ndarray]], rows: list[np.ndarray]) -> bool:
    """Keys in file order, and each row's dtype, shape and bytes as ``np.load`` gives them."""
    return len(found) == len(rows) and all(
        key == f"input/{number}"
        and value.dtype == row.dtype
        and value.shape == row.shape
        and value.tobytes() == row.tobytes()
        for number, ((key, value), row) in enumerate(zip(found, rows))
    )


def classify(item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
    failure = first_failure(readings, wdsx.ShardError)
    if failure is not None:
        return failure
    file, memory = readings["file"], readings["memory"]
    truth = expected(item.data)
    for reading in (file, memory):
        if reading.error is not None:
            continue
        if truth.rows is not None and _same(reading.result, truth.rows):
            continue
        if truth.rows is None and _same(
            reading.result, [item.original[row, ...] for row in range(len(item.original))]
        ):
            continue  # damage in bytes the format ignores
        return "silent-loss", f"{describe(readings)}; numpy: {truth.reason or len(truth.rows or [])} rows"
    if (file.error is None) != (memory.error is None):
        return "disagreement", describe(readings)
    if file.error is not None:
        kind = "error" if truth.rows is None and not truth.refusable else "strict"
        return kind, str(file.error)[:200]
    return ("ok", "") if truth.rows is not None else ("tolerated", truth.reason[:200])


def build(seed: int, scratch: str) -> Functions:
    return Functions("npy", make_input, read_all_ways, classify)
