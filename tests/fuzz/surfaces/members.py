"""The compressed-members surface: tar shards whose fields are gzip-compressed (``.txt.gz``,
``.json.gz``, ``.cls.gz``, ``.npy.gz``) or plain, decoded by wdsx, with one field damaged (its
compressed stream or its value) or replaced by a decompression bomb; and ``.tar.gz`` or
``.tar.bz2`` shards holding a member that inflates far beyond its compressed size.

The oracle is the standard library and numpy: the gzip streams decoded by
:func:`tests.fuzz.oracle.decompress_streams`, then ``bytes.decode``,
``json.loads``, ``int`` and ``np.load(allow_pickle=False)`` by the field's extension; and the
inflation policy of :mod:`wdsx.core.limits` (lowered in fuzz workers): a field or shard that
inflates to at most the grace size must be read; one that inflates past both the grace size
and the ratio times its compressed size must be refused; in between, either. A strict decode
must give every sample's values or a wdsx error; a continuing decode
(``handler=ignore_and_continue``) exactly the samples whose every field decodes.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import random
import tarfile
from dataclasses import dataclass
from typing import Any

import numpy as np

import wdsx
from tests.fuzz import mutate
from tests.fuzz.oracle import decompress_streams
from tests.fuzz.outcomes import Reading, attempt, describe, first_failure
from tests.fuzz.surfaces import FuzzInput
from wdsx.core.errors import WdsxError
from wdsx.core.limits import Inflation

FIELDS = ("txt", "json", "cls", "npy")
FIELD_BOMBS = (64 << 10, 200 << 10, 300 << 10, 1 << 20, 8 << 20)
"""Sizes of the zeros a bomb field inflates to (the fuzz workers' grace size is 256 KiB)."""
SHARD_BOMBS = ((".tar.gz", 100 << 10), (".tar.gz", 2 << 20), (".tar.bz2", 100 << 10), (".tar.bz2", 16 << 20))
"""Compressed shards holding one member of zeros of the given size."""
BAD_VALUES = {
    "txt": [b"\xff\xfe", b"ok\xc3", b"\xed\xa0\x80"],
    "json": [b"{", b"[1,]", b"", b"[" * 5000, b"\x00"],
    "cls": [b"x", b"", b"1.5", b"9" * 5000, b"\xff"],
    "npy": [b"", b"\x93NUMPY", b"\x93NUMPY\x01\x00\xff\xff{", b"junk"],
}


def _value(rng: random.Random, field: str) -> bytes:
    if field == "txt":
        return rng.choice(["", "hello", "snow ☃ " * rng.randint(1, 40), "\n\t"]).encode()
    if field == "json":
        return json.dumps({"n": rng.randint(-5, 5), "s": "é" * rng.randint(0, 9), "l": [1.5, None]}).encode()
    if field == "cls":
        return str(rng.randint(-3, 1000)).encode()
    out = io.BytesIO()
    np.save(out, np.arange(rng.randint(0, 20), dtype=rng.choice(["<f4", "<i8", "u1"])), allow_pickle=False)
    return out.getvalue()


def _gz(data: bytes) -> bytes:
    return gzip.compress(data, 6, mtime=0)


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


@dataclass(frozen=True)
class Input(FuzzInput):
    """One input: a shard's stored bytes and its file name."""

    suffix: str
    members: tuple[tuple[str, bytes], ...]
    """The tar's members, as written (for the oracle)."""


def gz_damage(rng: random.Random, data: bytearray) -> bytearray:
    """Damage a gzip stream: its bits, header, trailer, end; or a second member after it."""
    table = mutate.STREAM_MUTATIONS
    return table[rng.choice(sorted(table))](rng, data)


class MembersSurface:
    name = "members"

    def __init__(self) -> None:
        self.field_bombs = {size: _gz(bytes(size)) for size in FIELD_BOMBS}
        self.shard_bombs = []
        for suffix, size in SHARD_BOMBS:
            members = (("k0.bin", bytes(size)), ("k0.txt", b"after"))
            tar = _tar(list(members))
            stored = gzip.compress(tar, 9, mtime=0) if suffix == ".tar.gz" else bz2.compress(tar, 9)
            self.shard_bombs.append((suffix, size, members, stored))

    def make(self, seed: int, index: int) -> Input:
        rng = random.Random(f"members:{seed}:{index}")
        if rng.random() < 0.05:
            suffix, size, members, stored = rng.choice(self.shard_bombs)
            return Input(index, f"{size} zeros{suffix}", ("shard_bomb",), stored, suffix, members)
        members = []
        for number in range(rng.randint(1, 4)):
            for field in rng.sample(FIELDS, rng.randint(1, 3)):
                value = _value(rng, field)
                compressed = rng.random() < 0.6
                members.append(
                    (f"k{number}.{field}{'.gz' if compressed else ''}", _gz(value) if compressed else value)
                )
        at = rng.randrange(len(members))
        name, data = members[at]
        field = name.split(".")[1]
        kind = rng.choice(["none", "gz_damage", "gz_damage", "bomb", "bad_value"])
        if kind == "gz_damage" and name.endswith(".gz"):
            data = bytes(gz_damage(rng, bytearray(data)))
        elif kind == "bomb":
            name, data = f"{name.split('.')[0]}.{field}.gz", self.field_bombs[rng.choice(FIELD_BOMBS)]
        elif kind == "bad_value":
            bad = rng.choice(BAD_VALUES[field])
            data = _gz(bad) if name.endswith(".gz") else bad
        else:
            kind = "none"
        members[at] = (name, data)
        return Input(index, f"{len(members)} members", (kind,), _tar(members), ".tar", tuple(members))

    def read(self, item: Input, scratch: str) -> dict[str, Reading]:
        path = os.path.join(scratch, f"input{item.suffix}")
        with open(path, "wb") as stream:
            stream.write(item.data)

        def decoded(handler: Any) -> list[dict[str, Any]]:
            dataset = wdsx.WebDataset(
                path, shardshuffle=False, manifest=False, empty_check=False, handler=handler
            )
            return [_fields(sample) for sample in dataset.decode(handler=handler)]

        return {
            "strict": attempt(lambda: decoded(wdsx.reraise_exception)),
            "continuing": attempt(lambda: decoded(wdsx.ignore_and_continue)),
        }

    def classify(self, item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
        failure = first_failure(readings, WdsxError)
        if failure is not None:
            return failure
        samples = expected(item)
        strict, continuing = readings["strict"], readings["continuing"]
        must_read = all(verdict == "good" for sample in samples for verdict, _ in sample.values())
        may_read = all(verdict != "bad" for sample in samples for verdict, _ in sample.values())
        if continuing.error is not None:
            if item.suffix != ".tar" and not must_read:
                pass  # a shard bomb: the shard itself is refused, the handler ends it
            else:
                return "silent-loss", f"continuing: {describe(readings)}"
        elif not _continued(continuing.result, samples):
            return "silent-loss", f"continuing gave other samples: {describe(readings)}"
        if strict.error is not None:
            return ("strict" if must_read else "error"), str(strict.error)[:200]
        if not may_read:
            return "silent-loss", f"a field that must be refused was decoded: {describe(readings)}"
        if _equal(strict.result, [_values(sample) for sample in samples]):
            return "ok", ""
        return "silent-loss", f"other values than the oracle's: {describe(readings)}"


Verdict = tuple[str, Any]
"""``("good", value)``, ``("bad", None)`` (must be refused) or ``("either", value)``."""


def _inflated(data: bytes, limits: Inflation) -> tuple[str, bytes | None]:
    try:
        raw = decompress_streams(data, "gzip")
    except ValueError:
        return "bad", None
    if len(raw) <= limits.grace:
        return "good", raw
    return ("bad" if len(raw) > limits.allowed(len(data)) else "either"), raw


def _decoded(field: str, raw: bytes) -> Verdict:
    try:
        if field == "txt":
            return "good", raw.decode("utf-8")
        if field == "json":
            return "good", json.loads(raw)
        if field == "cls":
            return "good", int(raw)
        if field == "npy":
            return "good", np.load(io.BytesIO(raw), allow_pickle=False)
        return "good", raw
    except (ValueError, RecursionError, EOFError, OSError):
        return "bad", None


def expected(item: Input) -> list[dict[str, Verdict]]:
    """Each sample's key and fields (by webdataset's grouping: key up to the first dot), each
    with the oracle's verdict and value. A shard bomb's members get the shard's inflation verdict."""
    limits = Inflation.from_environment()
    shard = "good"
    if item.suffix != ".tar":
        size = sum(len(data) for _, data in item.members)
        shard = (
            "good" if size <= limits.grace else "bad" if size > limits.allowed(len(item.data)) else "either"
        )
    samples: dict[str, dict[str, Verdict]] = {}
    for name, data in item.members:
        key, _, extension = name.partition(".")
        field = extension.removesuffix(".gz")
        verdict: Verdict = (shard, data)
        if extension.endswith(".gz"):
            inflated, raw = _inflated(data, limits)
            verdict = (inflated, None) if raw is None else _worst(inflated, _decoded(field, raw))
        elif field in FIELDS:
            verdict = _worst(shard, _decoded(field, data))
        samples.setdefault(key, {"__key__": ("good", key)})[field] = verdict
    return list(samples.values())


def _worst(first: str, verdict: Verdict) -> Verdict:
    order = ("good", "either", "bad")
    return max(first, verdict[0], key=order.index), verdict[1]


def _fields(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded sample's key and fields (``.gz`` dropped from their names)."""
    return {
        key.removesuffix(".gz"): value
        for key, value in sample.items()
        if key == "__key__" or not key.startswith("__")
    }


def _values(sample: dict[str, Verdict]) -> dict[str, Any]:
    return {field: value for field, (_, value) in sample.items()}


def _continued(found: list[dict[str, Any]], samples: list[dict[str, Verdict]]) -> bool:
    """Whether a continuing decode gave, in order, every sample whose fields all decode, none
    with a field that must be refused, and any of those with a field in the grey zone."""
    wanted = iter(samples)
    for sample in found:
        for candidate in wanted:
            verdicts = {verdict for verdict, _ in candidate.values()}
            if "bad" not in verdicts and _equal([sample], [_values(candidate)]):
                break
            if verdicts == {"good"}:
                return False  # a sample that decodes was left out
        else:
            return False  # a sample the oracle does not give
    return all({verdict for verdict, _ in candidate.values()} != {"good"} for candidate in wanted)


def _equal(found: Any, wanted: Any) -> bool:
    if isinstance(wanted, np.ndarray):
        return (
            isinstance(found, np.ndarray)
            and found.dtype == wanted.dtype
            and found.shape == wanted.shape
            and (found.tobytes() == wanted.tobytes())
        )
    if isinstance(wanted, dict):
        return (
            isinstance(found, dict)
            and found.keys() == wanted.keys()
            and all(_equal(found[k], wanted[k]) for k in wanted)
        )
    if isinstance(wanted, list):
        return isinstance(found, list) and len(found) == len(wanted) and all(map(_equal, found, wanted))
    return type(found) is type(wanted) and found == wanted


def build(seed: int, scratch: str) -> MembersSurface:
    return MembersSurface()
