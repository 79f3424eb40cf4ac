"""What the inspection subcommands share: expanding shard arguments, reading raw samples."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from wdsx.read.samples import Cursor
from wdsx.read.shard import ReadSettings, read_piece
from wdsx.sources import SourceOptions
from wdsx.stages.shardlists import expand_urls


def shard_urls(specs: Sequence[str]) -> list[str]:
    """Shard URLs from command-line arguments (brace patterns, globs, ``s3://.../`` prefixes)."""
    return [url for spec in specs for url in expand_urls(spec)]


def raw_samples(url: str, options: SourceOptions | None = None) -> Iterator[dict[str, Any]]:
    """The samples of one shard, undecoded, each with its ``__position__``."""
    return read_piece(url, Cursor(0, 0), None, ReadSettings(options or SourceOptions()))


def field_bytes(value: Any) -> bytes:
    """A field as bytes: tar fields are bytes already; a JSONL sample's parsed value is its
    compact JSON text, an ``.npy`` row its ``.npy`` file."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, np.ndarray):
        stream = io.BytesIO()
        np.save(stream, value)
        return stream.getvalue()
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def field_size(value: Any) -> int:
    """A field's size in bytes: its payload, or an ``.npy`` row's data."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    return len(value) if isinstance(value, (bytes, bytearray, memoryview)) else len(field_bytes(value))


def payload_bytes(sample: dict[str, Any]) -> int:
    return sum(field_size(value) for key, value in sample.items() if not key.startswith("__"))


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"
