"""What the inspection subcommands share: expanding shard arguments, reading raw samples,
showing progress."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from wdsx.read.samples import Cursor
from wdsx.read.shard import ReadSettings, read_piece
from wdsx.sources import SourceOptions
from wdsx.sources.listing import expand_urls


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a usage error, status 2, otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


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


def _erase_line() -> None:
    """Erase the progress line on stderr: a control sequence of the command's own, written
    as it is where the command escapes the control characters of the text it writes."""
    getattr(sys.stderr, "write_control", sys.stderr.write)("\r\x1b[K")


class Progress:
    """Progress of a long command on stderr, while its results go to stdout: a tqdm bar when
    tqdm is installed, else one line rewritten in place at most every :attr:`INTERVAL`
    seconds; nothing at all when not ``enabled``. Results are printed with :meth:`write`,
    which keeps them clear of the bar. Use it as a context manager (it ends the bar's line)."""

    INTERVAL = 0.5

    def __init__(self, total: int | None, unit: str, enabled: bool):
        self.total, self.unit, self.enabled = total, unit, enabled
        self.done, self.label, self.shown_at = 0, "", 0.0
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True, leave=False)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def update(self, count: int = 1) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.monotonic() - self.shown_at >= self.INTERVAL:
            self._show()

    def describe(self, label: str) -> None:
        """Say what is being worked on (a shard's name) beside the count."""
        self.label = label
        if self.bar is not None:
            self.bar.set_description_str(label, refresh=False)

    def write(self, line: str) -> None:
        """Print a result line on stdout without tearing the progress line."""
        if self.bar is not None:
            self.bar.write(line, file=sys.stdout)
            return
        if self.enabled and self.shown_at:
            _erase_line()
            self.shown_at = 0.0
        print(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.shown_at:
            _erase_line()
            sys.stderr.flush()

    def _show(self) -> None:
        of = f" of {self.total:,}" if self.total is not None else ""
        _erase_line()
        sys.stderr.write(f"{self.label}: {self.done:,}{of} {self.unit}s")
        sys.stderr.flush()
        self.shown_at = time.monotonic()
