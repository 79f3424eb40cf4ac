"""Reading a stream that nothing bounds in time: a command's output (``pipe:``) or a local
FIFO or character device.

Such a stream cannot seek, and whoever writes it can keep a read waiting for ever. So every
read first waits, with ``poll``, for the stream to hold bytes or to end, and that waiting is
judged by the stall watch (:mod:`wdsx.sources.stall`): a stream that brings too few bytes in
the stall window fails with an error naming the byte it stalled at, instead of hanging.
"""

from __future__ import annotations

import logging
import os
import select
import stat
import time
from typing import IO

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.stall import StallWatch

log = logging.getLogger("wdsx")


class PolledStream(Source):
    """The bytes of ``stream`` (an unbuffered file object), each read taking what the stream
    holds once it holds anything; starting at an offset reads and discards up to it.
    Subclasses open the stream, and may check how it ended (:meth:`_finish`)."""

    seekable = False

    def _start(self, url: str, stream: IO[bytes], offset: int, options: SourceOptions) -> None:
        """Read ``stream`` from here on (``offset``: the first byte wanted)."""
        self.url = url
        self._stream = stream
        self._options = options
        self._position = 0
        self._watch = StallWatch(options)
        self._poll = select.poll()
        self._poll.register(stream, select.POLLIN)
        self._ended = False
        self._closed = False
        if offset:
            log.info(
                "%s: a stream cannot seek; reading and discarding %d bytes to reach the offset", url, offset
            )
            try:
                self._discard(offset)
            except BaseException:
                self.close()
                raise

    def _discard(self, offset: int) -> None:
        left = offset
        while left > 0:
            part = self.read(min(left, self._options.chunk))
            if not part:
                raise SourceError(self.url, f"stream ended at byte {offset - left}, before offset {offset}")
            left -= len(part)

    def read(self, n: int) -> bytes:
        if self._closed:
            raise ValueError(f"{self.url}: read from a closed source")
        if self._ended:
            return b""
        data = self._receive(n)
        if not data and n > 0:
            self._ended = True
            self._finish()
        self._position += len(data)
        return data

    def _receive(self, n: int) -> bytes:
        """Up to ``n`` bytes once the stream holds some (or has ended); an error when its writer
        keeps the read waiting past the stall window."""
        while True:
            stalled = self._watch.stalled()
            if stalled is not None:
                raise SourceError(self.url, f"reading at byte {self._position}: {stalled}")
            started = time.monotonic()
            ready = self._poll.poll(1000 * self._watch.remaining() + 1)
            data = self._stream.read(n) if ready else None
            self._watch.record(time.monotonic() - started, len(data or b""))
            if data is not None:
                return data

    def _finish(self) -> None:
        """At the end of the stream (nothing to check by default)."""

    def close(self) -> None:
        if not self._closed:
            self._closed = self._ended = True
            close_quietly(self._stream)
            self._release()

    def _release(self) -> None:
        """After the stream is closed: release what else its subclass holds (nothing by default)."""

    def __del__(self) -> None:
        if hasattr(self, "_closed"):
            self.close()


def close_quietly(stream: IO[bytes] | None) -> None:
    """Close ``stream``, if any, ignoring a failure to (a pipe whose other end is gone)."""
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass


def is_stream_device(path: str) -> bool:
    """Whether the local ``path`` is a FIFO or a character device (read as a stream), not a
    file whose bytes are all there."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


class DeviceSource(PolledStream):
    """A local FIFO or character device given as a shard (``mkfifo``, ``/dev/stdin``): opened
    without waiting for a writer, and read as a stream. Its writer may never come, or never
    send: the stall window ends the wait with an error, as for a ``pipe:`` command."""

    def __init__(self, url: str, path: str, offset: int = 0, options: SourceOptions | None = None):
        self.local_path = None  # not a file that can be mapped or scanned
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exn:
            raise SourceError(url, f"cannot open: {exn.strerror or exn}") from exn
        self._start(url, os.fdopen(descriptor, "rb", buffering=0), offset, options or SourceOptions())
