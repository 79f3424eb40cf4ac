"""Remote reads that survive dropped connections by continuing at the first byte not yet delivered.

A shard is fetched as one long response. When the connection drops, times out, ends early or
stalls (:mod:`wdsx.sources.stall`), :class:`ResumingSource` opens a new ranged request that
starts exactly at the next byte the caller has not seen: no restart from the beginning of the
shard, no duplicated and no missing bytes. Backends (S3, HTTP) only say how to open a response
at a byte offset and which failures are worth another attempt.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.stall import StallWatch

log = logging.getLogger("wdsx")
T = TypeVar("T")


class TransientError(Exception):
    """A failure worth another attempt: a refused, reset or timed-out connection, a 5xx reply.
    ``retry_after``: the seconds the server asked to wait before the next one, if it said."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class _Stalled(TransientError):
    """A reply that delivered less than the minimum rate over a whole stall window."""


class _ShortReply(TransientError):
    """A reply that ended cleanly before the bytes asked for: a server that sends a range in
    several shorter replies. Reading on asks for the rest at once, without waiting."""


class Body(Protocol):
    def read(self, n: int) -> bytes: ...

    def close(self) -> None: ...


@dataclass
class Response:
    """An open remote response and what it says about the bytes it carries."""

    body: Body
    """Raises :class:`TransientError` when the connection fails while reading."""
    start: int
    """Offset of the body's first byte: 0 when the server ignored the requested range."""
    end: int | None
    """Offset one past the last byte this response should deliver (the object's size, or the
    end of the range asked for, when that comes first), when known: a body that stops short
    of it is a dropped connection, read on from where it stopped."""
    version: str | None = None
    """ETag or similar: a resumed read must see the same version of the object."""


class _EmptyBody:
    def read(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        pass


def empty_response(at: int) -> Response:
    """What a stream opened exactly at the end of an object reads: nothing, at once."""
    return Response(_EmptyBody(), at, at)


Connect = Callable[[int, "int | None"], Response]
"""Opens a response whose body starts at the first offset (or earlier, if Range is ignored)
and, when the second is given, ends before it (or later, likewise)."""


def range_header(start: int, end: int | None) -> str | None:
    """The ``Range:`` value for bytes ``[start, end)`` (``end`` None: to the end of the object);
    None for the whole object."""
    if end is not None:
        return f"bytes={start}-{end - 1}"
    return f"bytes={start}-" if start else None


def content_range(value: str | None) -> tuple[int, int | None] | None:
    """First byte and total size from a ``Content-Range: bytes FIRST-LAST/TOTAL`` header."""
    match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", (value or "").strip())
    if not match:
        return None
    total = match.group(2)
    return int(match.group(1)), None if total == "*" else int(total)


def wanted_end(total: int | None, stop: int | None) -> int | None:
    """Where the bytes asked for end: ``stop`` (a bounded request) or the object's ``total``
    size, whichever comes first; None when neither is known. A server may send a range in
    several shorter replies; this, not the reply's own last byte, says when the data ends."""
    if stop is None or total is None:
        return total if stop is None else stop
    return min(stop, total)


class Attempts:
    """Consecutive failures of one remote operation; waits with exponential backoff between them.

    Progress resets the count, so a long shard over a flaky link only fails when
    ``options.retries`` attempts in a row deliver nothing.
    """

    def __init__(self, url: str, options: SourceOptions):
        self.url = url
        self.options = options
        self.failures = 0

    def failed(self, exn: TransientError, doing: str) -> None:
        """Wait before the next attempt, or raise :class:`SourceError` when none are left."""
        self.failures += 1
        if self.failures > self.options.retries:
            raise SourceError(
                self.url, f"{doing}: gave up after {self.options.retries} retries: {exn}"
            ) from exn
        delay = self.options.backoff * 2 ** (self.failures - 1) * random.uniform(0.75, 1.25)
        if exn.retry_after is not None:  # the server's Retry-After, up to one timeout
            delay = max(delay, min(exn.retry_after, self.options.timeout))
        log.warning(
            "%s: %s: %s; retry %d of %d in %.2fs",
            self.url,
            doing,
            exn,
            self.failures,
            self.options.retries,
            delay,
        )
        time.sleep(delay)

    def succeeded(self) -> None:
        self.failures = 0


def call_with_retries(url: str, options: SourceOptions, doing: str, action: Callable[[], T]) -> T:
    """``action()``, attempted again after each :class:`TransientError` with backoff."""
    attempts = Attempts(url, options)
    while True:
        try:
            return action()
        except TransientError as exn:
            attempts.failed(exn, doing)


class ResumingSource(Source):
    """A remote shard read as one stream that reconnects where it stopped after a failure.

    With ``end``, only bytes before it are asked for (a bounded ``Range:``) and read: a random
    read of one sample costs one request for exactly its bytes."""

    def __init__(
        self, url: str, offset: int, options: SourceOptions, connect: Connect, end: int | None = None
    ):
        self.url = url
        self.local_path = None
        self.seekable = True
        self.options = options
        self.position = offset
        """Offset of the next byte :meth:`read` returns."""
        self._connect = connect
        self.end = end
        self._attempts = Attempts(url, options)
        self._stalls = Attempts(url, options)
        """Stalls since the rate was last healthy: a trickle that delivers a few bytes per
        connection resets :attr:`_attempts`, never this."""
        self._watch = StallWatch(options)
        self._failure: TransientError | None = None
        """A read's failure after it had received some bytes, raised by the next read."""
        self._version: str | None = None
        self._closed = False
        self._response = self._open()

    def _open(self) -> Response:
        while True:
            try:
                if self.end is not None and self.position >= self.end:
                    response = empty_response(self.position)
                else:
                    response = self._connect(self.position, self.end)
                break
            except TransientError as exn:
                self._attempts.failed(exn, f"opening at byte {self.position}")
        if self._version is None:
            self._version = response.version
        elif response.version and response.version != self._version:
            response.body.close()
            raise SourceError(
                self.url,
                f"object changed while reading (version {self._version} became {response.version}) "
                f"at byte {self.position}",
            )
        if response.start > self.position:
            response.body.close()
            raise SourceError(
                self.url, f"asked for bytes from {self.position}, got bytes from {response.start}"
            )
        if response.start < self.position:
            log.info(
                "%s: server ignored the range request; reading and discarding %d bytes to reach byte %d",
                self.url,
                self.position - response.start,
                self.position,
            )
        self._body_position = response.start
        self._opened_at = self.position
        return response

    def read(self, n: int) -> bytes:
        if self._closed:
            raise ValueError(f"{self.url}: read from a closed source")
        if self.end is not None:
            n = min(n, self.end - self.position)
            if n <= 0:
                return b""
        while True:
            response = self._response
            try:
                data = self._read_at_position(response, n)
            except TransientError as exn:
                response.body.close()
                stalled = self._watch.stalled()
                if stalled is not None:
                    self._stalls.failed(_Stalled(stalled), f"reading at byte {self.position}")
                    self._watch.restart()
                elif not (isinstance(exn, _ShortReply) and self.position > self._opened_at):
                    self._attempts.failed(exn, f"reading at byte {self.position}")
                self._response = self._open()
                continue
            if data:
                self.position += len(data)
                self._attempts.succeeded()
            return data

    def _read_at_position(self, response: Response, n: int) -> bytes:
        """Up to ``n`` bytes from :attr:`position`, first discarding what precedes it."""
        while self._body_position < self.position:
            skipped = self._receive(
                response.body, min(self.position - self._body_position, self.options.chunk)
            )
            if not skipped:
                raise TransientError(f"response ended at byte {self._body_position}")
            self._body_position += len(skipped)
        data = self._receive(response.body, min(n, self.options.chunk))
        self._body_position += len(data)
        if not data and n > 0 and response.end is not None and self.position < response.end:
            raise _ShortReply(f"reply ended at byte {self.position}, before byte {response.end}")
        return data

    def _receive(self, body: Body, n: int) -> bytes:
        """Up to ``n`` bytes of ``body``, read piece by piece (each read returns once some bytes
        arrive) until there are ``n``, the body ends, a read fails or the rate stalls. The time
        each read waits counts toward the stall window, failed reads too (a socket timeout is a
        silence as long as the timeout). A failure after some bytes is kept for the next call,
        so that those bytes are delivered first."""
        if self._failure is not None:
            kept, self._failure = self._failure, None
            raise kept
        pieces: list[bytes] = []
        got = 0
        while got < n:
            data = b""
            failure: TransientError | None = None
            stalled = self._watch.stalled()
            if stalled is not None:
                failure = _Stalled(stalled)
            else:
                started = time.monotonic()
                try:
                    data = body.read(n - got)
                except TransientError as exn:
                    failure = exn
                if self._watch.record(time.monotonic() - started, len(data)):
                    self._stalls.succeeded()
            if failure is not None:
                if not got:
                    raise failure
                self._failure = failure
                break
            if not data:
                break
            pieces.append(data)
            got += len(data)
        return b"".join(pieces)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._response.body.close()
