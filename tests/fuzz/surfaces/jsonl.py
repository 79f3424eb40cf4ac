"""The JSONL surface: small JSONL shards (plain, gzip or bzip2), mutated byte-wise and
line-wise, read by wdsx strictly and with a continuing handler, from a file and from a stream of
short reads.

The oracle is ``json.loads`` on each line, with the format's rules: a line ends at ``\\n``, the
last one may lack it, an empty line is bad, a line longer than ``WDSX_MAX_LINE_BYTES`` is bad.
A strict reading must give every line's value (when every line is good) or a ``ShardError``;
a continuing reading must give exactly the good lines (keys and values) wherever the stored
bytes decompress (the good lines up to the refusal, where wdsx refuses a compressed stream
Python's decompressor reads). (Where they do not, a stream reader may deliver lines inflated from damaged
bytes before the stream's checksum shows the damage, as any streaming reader would; only the
strict reading's error is checked there.)
"""

from __future__ import annotations

import bz2
import gzip
import json
import math
import os
import random
from dataclasses import dataclass
from typing import Any

import wdsx
from tests.fuzz import mutate
from tests.fuzz.memory import url_of
from tests.fuzz.oracle import decompress_streams
from tests.fuzz.outcomes import Reading, attempt, describe, first_failure
from tests.fuzz.surfaces import Functions, FuzzInput
from wdsx.core.limits import max_line_bytes

COMPRESSORS = {
    None: lambda data: data,
    "gz": lambda data: gzip.compress(data, 6, mtime=0),
    "bz2": bz2.compress,
}
KINDS = {"gz": "gzip", "bz2": "bzip2"}
STEPS = (None, None, 1, 7, 64, 4096)
KEY_ENDINGS = ("", "é", " ", "\n")
PIECES = [
    b"\n",
    b"\r\n",
    b"",
    b" ",
    b"\0",
    b"\xff",
    b"\xef\xbb\xbf",
    b"{",
    b"}",
    b'"',
    b"\\",
    b"\\u",
    b"\\ud800",
    b",",
    b"[",
    b"]",
    b"NaN",
    b"-Infinity",
    b"1e999",
    b"-",
    b"0x1",
    b"\t",
    b"\xc3",
    b"\xe2\x82",
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value: text with escapes and non-ASCII, numbers, nesting."""
    choice = rng.random()
    if depth < 3 and choice < 0.25:
        return {f"k{i}{rng.choice(KEY_ENDINGS)}": _value(rng, depth + 1) for i in range(rng.randint(0, 4))}
    if depth < 3 and choice < 0.4:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if choice < 0.6:
        return rng.choice(
            ["", "a", "snow ☃", 'quote " and \\ backslash', "tab\tline\nend", "\u2028", "x" * 300]
        )
    if choice < 0.75:
        return rng.choice([0, -1, 7, 2**53, -(2**63), 10**30])
    if choice < 0.9:
        return rng.choice([0.5, -2.25, 1e-300, 6.02e23])
    return rng.choice([True, False, None])


def _line(rng: random.Random) -> bytes:
    value = _value(rng)
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5, separators=rng.choice([None, (",", ":")]))
    return text.encode()


@dataclass(frozen=True)
class Input(FuzzInput):
    """One JSONL fuzz input: a shard's stored bytes, and how they are compressed."""

    compression: str | None
    step: int | None
    original: tuple[Any, ...]
    """The values of the undamaged shard's lines."""

    @property
    def file_name(self) -> str:
        return "input.jsonl" + (f".{self.compression}" if self.compression else "")


def line_edit(rng: random.Random, data: bytearray) -> bytearray:
    """Delete, duplicate, blank or swap lines, or split one in two."""
    lines = bytes(data).split(b"\n")
    at = rng.randrange(len(lines))
    action = rng.randrange(5)
    if action == 0:
        del lines[at]
    elif action == 1:
        lines.insert(at, lines[at])
    elif action == 2:
        lines.insert(at, rng.choice([b"", b" ", b"\r"]))
    elif action == 3:
        lines.reverse()
    else:
        cut = rng.randint(0, len(lines[at]))
        lines[at : at + 1] = [lines[at][:cut], lines[at][cut:]]
    return bytearray(b"\n".join(lines))


def splice(rng: random.Random, data: bytearray) -> bytearray:
    """Insert a piece of JSON syntax, an odd byte or a newline somewhere."""
    at = rng.randint(0, len(data))
    data[at:at] = rng.choice(PIECES)
    return data


def long_line(rng: random.Random, data: bytearray) -> bytearray:
    """A line about as long as the line limit: just under, at, or over it; valid or not."""
    limit = max_line_bytes()
    size = limit + rng.choice([-2, -1, 0, 1, 2, 500])
    body = b'"' + b"y" * max(0, size - 2) + b'"' if rng.random() < 0.7 else b"z" * size
    at = rng.choice([0, len(data)]) if rng.random() < 0.5 else data.find(b"\n") + 1
    data[at:at] = body + (b"\n" if at < len(data) or rng.random() < 0.5 else b"")
    return data


def deep(rng: random.Random, data: bytearray) -> bytearray:
    """A deeply nested line (JSON parsers recurse), or a number with very many digits."""
    depth = rng.choice([50, 999, 1000, 100_000])
    line = rng.choice(
        [b"[" * depth + b"]" * depth, b'{"a":' * depth + b"1" + b"}" * depth, b"[" * depth, b"9" * 5000]
    )
    if len(line) > max_line_bytes():
        line = line[: max_line_bytes()]
    at = data.find(b"\n") + 1 if rng.random() < 0.5 else 0
    data[at:at] = line + b"\n"
    return data


LINE_MUTATIONS = {
    "bit_flips": mutate.bit_flips,
    "byte_values": mutate.byte_values,
    "truncate": mutate.truncate,
    "append": mutate.append,
    "line_edit": line_edit,
    "splice": splice,
    "long_line": long_line,
    "deep": deep,
}
STREAM_MUTATIONS = {
    "stream_bit_flips": mutate.bit_flips,
    "stream_truncate": mutate.truncate,
    "stream_trailer": mutate.stream_trailer,
    "stream_header": mutate.stream_header,
    "stream_concat": mutate.stream_concat,
    "stream_append": mutate.append,
}


def make_input(seed: int, index: int) -> Input:
    rng = random.Random(f"jsonl:{seed}:{index}")
    lines = [_line(rng) for _ in range(rng.randint(0, 6))]
    text = b"".join(line + b"\n" for line in lines)
    if lines and rng.random() < 0.2:
        text = text[:-1]  # the last line without its newline
    compression = rng.choice([None, None, None, "gz", "bz2"])
    stream = compression is not None and rng.random() < 0.4
    table = STREAM_MUTATIONS if stream else LINE_MUTATIONS
    names = rng.choices(sorted(table), k=rng.choice([1, 1, 2, 3]))
    data = bytearray(COMPRESSORS[compression](text) if stream else text)
    for name in names:
        data = table[name](rng, data)
    stored = bytes(data) if stream else COMPRESSORS[compression](bytes(data))
    original = tuple(json.loads(line) for line in lines)
    what = f"{len(lines)} lines{'.' + compression if compression else ''}"
    return Input(index, what, tuple(names), stored, compression, rng.choice(STEPS), original)


@dataclass(frozen=True)
class Expected:
    """What the oracle says a JSONL shard holds."""

    readable: bool
    """Whether the stored bytes decompress (always, for plain shards)."""
    lines: list[tuple[int, Any, bool]]
    """``(line index, value, good)`` of every line (value None for a bad line)."""

    @property
    def clean(self) -> bool:
        return self.readable and all(good for _, _, good in self.lines)

    @property
    def good(self) -> list[tuple[str, Any]]:
        return [(f"input/{index}", value) for index, value, good in self.lines if good]


def expected(item: Input) -> Expected:
    try:
        text = (
            item.data if item.compression is None else decompress_streams(item.data, KINDS[item.compression])
        )
    except ValueError:
        return Expected(False, [])
    lines = text.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the newline ended the last line
    limit = max_line_bytes()
    found = []
    for index, line in enumerate(lines):
        if len(line) > limit:
            found.append((index, None, False))
            continue
        try:
            found.append((index, json.loads(line), True))
        except (ValueError, RecursionError):
            found.append((index, None, False))
    return Expected(True, found)


def _pairs(dataset: Any) -> list[tuple[str, Any]]:
    return [(sample["__key__"], sample["json"]) for sample in dataset]


def read_all_ways(item: Input, scratch: str) -> dict[str, Reading]:
    path = os.path.join(scratch, item.file_name)
    with open(path, "wb") as stream:
        stream.write(item.data)
    url = url_of(item.data, item.file_name, item.step)
    skip = wdsx.ignore_and_continue
    return {
        "file": attempt(
            lambda: _pairs(wdsx.WebDataset(path, shardshuffle=False, manifest=False, empty_check=False))
        ),
        "memory": attempt(
            lambda: _pairs(wdsx.WebDataset(url, shardshuffle=False, manifest=False, empty_check=False))
        ),
        "continuing": attempt(
            lambda: _pairs(
                wdsx.WebDataset(path, shardshuffle=False, manifest=False, empty_check=False, handler=skip)
            )
        ),
    }


def _same(found: list[tuple[str, Any]], wanted: list[tuple[str, Any]]) -> bool:
    """Equal keys and values, NaN equal to NaN (``json.loads`` reads ``NaN``)."""
    return len(found) == len(wanted) and all(
        key == other_key and _equal(value, other) for (key, value), (other_key, other) in zip(found, wanted)
    )


def _equal(value: Any, other: Any) -> bool:
    if isinstance(value, float) and isinstance(other, float) and math.isnan(value):
        return math.isnan(other)
    if isinstance(value, list) and isinstance(other, list):
        return len(value) == len(other) and all(_equal(a, b) for a, b in zip(value, other))
    if isinstance(value, dict) and isinstance(other, dict):
        return value.keys() == other.keys() and all(_equal(value[k], other[k]) for k in value)
    return type(value) is type(other) and value == other


def _continued(continuing: Reading, good: list[tuple[str, Any]], refused_stream: bool) -> bool:
    """Whether a continuing reading gave the good lines: all of them, or where wdsx refused a
    compressed stream that Python's decompressor reads (``refused_stream``), those before the
    refusal."""
    if continuing.error is not None:
        return False
    if refused_stream:
        return _same(continuing.result, good[: len(continuing.result)])
    return _same(continuing.result, good)


def classify(item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
    failure = first_failure(readings, wdsx.ShardError)
    if failure is not None:
        return failure
    file, memory, continuing = readings["file"], readings["memory"], readings["continuing"]
    if (file.error is None) != (memory.error is None) or (
        file.error is None and not _same(file.result, memory.result)
    ):
        return "disagreement", describe(readings)
    truth = expected(item)
    refused_stream = file.error is not None and item.compression is not None
    if truth.readable and not _continued(continuing, truth.good, refused_stream):
        return (
            "silent-loss",
            f"continuing: {describe({'continuing': continuing})}, {len(truth.good)} good lines",
        )
    if file.error is not None:
        return ("strict" if truth.clean else "error"), str(file.error)[:200]
    if truth.clean and _same(file.result, truth.good):
        return "ok", ""
    if not truth.clean and _same(file.result, [(f"input/{i}", v) for i, v in enumerate(item.original)]):
        return "tolerated", "damage in bytes the format ignores"
    return (
        "silent-loss",
        f"{len(file.result)} lines read, the oracle says {describe({'oracle': Reading(truth.good)})}",
    )


def build(seed: int, scratch: str) -> Functions:
    return Functions("jsonl", make_input, read_all_ways, classify)
