"""The two interfaces every storage backend implements: a readable shard and a writable one.

A :class:`Source` is one shard's bytes starting at a given offset; resuming a run opens the
shard at the offset of the next sample (a seek, or a ``Range:`` request). A :class:`Sink` is a
shard being written: its bytes become visible under the final name only on :meth:`Sink.commit`,
so a crash while writing never leaves a truncated shard behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from wdsx.core.redact import redact_settings, redact_text
from wdsx.core.streams import read_into


@dataclass(frozen=True)
class SourceOptions:
    """How shards are fetched. Picklable, so it travels to DataLoader workers."""

    timeout: float = 60.0
    """Seconds to wait for a connection or for the next bytes of a remote shard (reads wait at
    most the stall window, when that is shorter)."""
    stall_timeout: float | None = None
    """Seconds a read of a remote shard (or of a ``pipe:`` command's output) may spend waiting
    while less than ``min_rate`` bytes per second arrive; then it counts as stalled and is
    retried from its last byte. None: ``WDSX_STALL_TIMEOUT``, else 60 (see
    :mod:`wdsx.sources.stall`)."""
    min_rate: int = 1024
    """Bytes per second, averaged over the stall window, below which a trickling read is stalled."""
    retries: int = 5
    """Attempts after a failed or dropped remote read; each continues from the last byte read."""
    backoff: float = 0.25
    """First delay between retries in seconds; doubles with each retry."""
    chunk: int = 1 << 20
    """Bytes per read from a remote stream."""
    s3: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``boto3.client("s3", ...)`` (``endpoint_url``, ``region_name``...)."""
    gcs: dict[str, Any] = field(default_factory=dict)
    """``gs://`` settings: ``endpoint_url``, ``project``, ``anonymous`` (see :mod:`wdsx.sources.gcs`)."""
    azure: dict[str, Any] = field(default_factory=dict)
    """``az://`` settings: ``connection_string``, ``account_name``, ``account_key``, ``sas_token``,
    ``account_url``, ``credential``, ``anonymous`` (see :mod:`wdsx.sources.azure`)."""
    hf: dict[str, Any] = field(default_factory=dict)
    """``hf://`` settings: ``endpoint`` and ``token`` (see :mod:`wdsx.sources.hf`)."""
    fsspec: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Keyword arguments for ``fsspec.filesystem(protocol, ...)``, by protocol."""
    cache_dir: str | None = None
    """Keep a local copy of every remote shard read, under this directory."""
    cache_size: int = -1
    """Bound on the cache in bytes; least recently used shards are evicted. -1: unbounded."""
    allow_pipe: bool = True
    """Whether ``pipe:`` URLs may run shell commands (off in secure mode, ``WDS_SECURE=1``)."""
    prefetch: int = 2
    """How many upcoming remote shards a reader opens in the background while reading one."""
    max_companion_bytes: int = 256 << 20
    """The largest manifest or offset index read (a bigger one is an error, not read whole)."""

    def __repr__(self) -> str:
        """As a dataclass shows itself, with secret settings (``aws_secret_access_key``, an
        Azure ``account_key``, a Hub ``token``...) masked."""
        shown = ", ".join(
            f"{item.name}={redact_settings(getattr(self, item.name))!r}" for item in fields(self)
        )
        return f"{type(self).__name__}({shown})"


class Source:
    """A shard's bytes from some offset on. Subclasses implement :meth:`read` and :meth:`close`."""

    url: str
    local_path: str | None = None
    seekable: bool = True
    """False when opening at an offset means reading and discarding the bytes before it."""

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes; ``b""`` only at the end of the shard."""
        raise NotImplementedError

    def readinto(self, buffer: memoryview) -> int:
        """Read into ``buffer``; returns the number of bytes, 0 only at the end of the shard."""
        return read_into(self.read, buffer)

    def skip(self, n: int) -> None:
        """Move ``n`` bytes forward without returning them."""
        while n > 0:
            part = self.read(min(n, 1 << 20))
            if not part:
                return
            n -= len(part)

    def close(self) -> None:
        """Release the file, connection or process; safe to call twice."""

    def interrupt(self) -> None:
        """Make a read that another thread is blocked in return soon: called, from another
        thread, on a source dropped while it is being read (a shard opened ahead of time that
        is no longer wanted), before it is closed. By default nothing is done: the read ends
        within the source's own timeouts."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {redact_text(getattr(self, 'url', '?'))}>"

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_up_to(read: Callable[[int], bytes], limit: int) -> bytes | None:
    """Everything ``read`` returns until its end, or None when that is more than ``limit``
    bytes: reading stops one byte past the limit, so an endless stream costs ``limit`` bytes."""
    data = bytearray()
    while len(data) <= limit:
        part = read(min(1 << 20, limit + 1 - len(data)))
        if not part:
            return bytes(data)
        data += part
    return None


class Sink:
    """A shard being written. Bytes appear under the final name only after :meth:`commit`."""

    url: str

    def write(self, data: bytes | bytearray | memoryview) -> int:
        raise NotImplementedError

    def commit(self) -> None:
        """Make the shard visible under its final name, complete."""
        raise NotImplementedError

    def abort(self) -> None:
        """Discard everything written; the final name is left untouched."""
        raise NotImplementedError

    def __enter__(self) -> Sink:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
