"""What the inspection subcommands share: expanding shard arguments, reading raw samples."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

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


def payload_bytes(sample: dict[str, Any]) -> int:
    return sum(len(value) for key, value in sample.items() if not key.startswith("__"))


def human(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"
