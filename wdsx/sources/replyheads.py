"""HTTP connections whose reply head (status line and headers) must arrive within the read
timeout, however slowly the server sends it, and whose chunked bodies are checked.

A socket timeout bounds each wait for bytes, so a server that sends its headers one byte at a
time, each just within the timeout, would hold a request for as long as it likes; the stall
watch (:mod:`wdsx.sources.stall`) only judges bodies. Here a timer started when the request
has been sent shuts the socket down if the head is not complete when the connection's timeout
(``read_timeout(options)``) has passed; the reply then fails with a ``TimeoutError`` saying so,
which the caller retries like any dropped connection.

``http.client`` reads the two bytes that end each chunk of a chunked body without looking at
them, so a reply whose chunk sizes are damaged delivers other bytes than the server's, with no
error. :class:`CheckedChunks` refuses a chunk not followed by CRLF, as RFC 9112 frames chunks.
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
import urllib.request
from typing import Any


class CheckedChunks(http.client.HTTPResponse):
    """A reply whose chunked body must be framed as RFC 9112 says: each chunk's data followed
    by CRLF (checked here; ``http.client`` discards those two bytes unread)."""

    chunk_left: int | None

    def _get_chunk_left(self) -> int | None:
        if self.chunk_left == 0:
            end = self._safe_read(2)  # type: ignore[attr-defined]
            if end != b"\r\n":
                raise http.client.HTTPException(
                    f"a chunk of the reply's body ends in {end!r}, not CRLF: damaged chunked framing"
                )
            self.chunk_left = None
        return super()._get_chunk_left()  # type: ignore[misc]


class _HeadDeadline:
    """Mixed into an ``http.client`` connection class: ``getresponse`` under a deadline, and
    replies read as :class:`CheckedChunks`."""

    timeout: Any
    sock: socket.socket | None
    response_class = CheckedChunks

    def getresponse(self) -> http.client.HTTPResponse:
        deadline = self.timeout if isinstance(self.timeout, (int, float)) else None
        if deadline is None:
            return super().getresponse()  # type: ignore[misc]
        expired = threading.Event()
        timer = threading.Timer(deadline, self._expire, args=(expired,))
        timer.daemon = True
        timer.start()
        late = f"the reply's status line and headers took more than {deadline:g} s"
        try:
            reply = super().getresponse()  # type: ignore[misc]
        except (OSError, http.client.HTTPException):
            if expired.is_set():
                raise TimeoutError(late) from None
            raise
        finally:
            timer.cancel()
        if expired.is_set():
            # The socket was shut down while the head was read: http.client takes the end of
            # the stream for the end of the headers, and the reply it made is not the server's.
            reply.close()
            raise TimeoutError(late)
        return reply

    def _expire(self, expired: threading.Event) -> None:
        expired.set()
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed: the reply has ended anyway


@functools.cache
def _with_deadline(connection_class: Any) -> Any:
    """``connection_class`` with the deadline mixed in (one class per connection class)."""
    return type(f"Timed{connection_class.__name__}", (_HeadDeadline, connection_class), {})


class HTTPHandler(urllib.request.HTTPHandler):
    """``http://`` through connections with a deadline on the reply head."""

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(_with_deadline(http_class), req, **kwargs)


class HTTPSHandler(urllib.request.HTTPSHandler):
    """``https://`` through connections with a deadline on the reply head."""

    def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
        return super().do_open(_with_deadline(http_class), req, **kwargs)
