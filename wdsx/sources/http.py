"""``http://`` and ``https://`` shards read in-process with ranged GETs that resume where they stopped.

No ``curl`` subprocess: redirects, proxies from the environment and TLS come from
:mod:`urllib.request`. A server that ignores ``Range`` (answers 200 instead of 206) still gives
the right bytes: the stream discards what precedes the requested offset, and logs that it did.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from email.message import Message

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.retry import Response, ResumingSource, TransientError, content_range, empty_response

_RETRY_STATUSES = frozenset((408, 425, 429))


class _HTTPBody:
    """A response body whose network failures surface as :class:`TransientError`."""

    def __init__(self, reply: http.client.HTTPResponse):
        self._reply = reply

    def read(self, n: int) -> bytes:
        try:
            return self._reply.read(n)
        except (OSError, http.client.HTTPException) as exn:
            raise TransientError(f"{type(exn).__name__}: {exn}") from exn

    def close(self) -> None:
        self._reply.close()


def open_http(url: str, offset: int, options: SourceOptions) -> Source:
    """Stream an HTTP(S) URL from ``offset`` (a ``Range: bytes=offset-`` GET when > 0)."""

    def connect(start: int) -> Response:
        headers = {"Accept-Encoding": "identity"}
        if start:
            headers["Range"] = f"bytes={start}-"
        doing = f"GET from byte {start}"
        try:
            reply = urllib.request.urlopen(
                urllib.request.Request(url, headers=headers), timeout=options.timeout
            )
        except urllib.error.HTTPError as exn:
            exn.close()
            if exn.code == 416:
                return _past_end(url, start, exn.headers)
            said = f"HTTP {exn.code} {exn.reason}"
            if exn.code >= 500 or exn.code in _RETRY_STATUSES:
                raise TransientError(said) from exn
            raise SourceError(url, f"{doing}: {said}") from exn
        except (OSError, http.client.HTTPException) as exn:
            raise TransientError(f"{doing}: {getattr(exn, 'reason', None) or exn}") from exn
        length = reply.headers.get("Content-Length")
        if reply.status == 206:
            first, total = content_range(reply.headers.get("Content-Range")) or (start, None)
        else:
            first, total = 0, int(length) if length else None
        return Response(_HTTPBody(reply), first, total, reply.headers.get("ETag"))

    return ResumingSource(url, offset, options, connect)


def _past_end(url: str, start: int, headers: Message) -> Response:
    """No bytes for an offset at the very end (a 416's ``Content-Range: bytes */SIZE``); else an error."""
    match = re.fullmatch(r"bytes \*/(\d+)", headers.get("Content-Range", "").strip())
    size = int(match.group(1)) if match else None
    if size != start:
        known = f" ({size} bytes)" if size is not None else ""
        raise SourceError(url, f"offset {start} is past the end of the resource{known}")
    return empty_response(start)
