"""Shards read in-process over HTTP with ranged GETs that resume where they stopped.

This is the one streaming reader behind ``http(s)://`` and the object stores that speak HTTP
(``gs://``, ``az://``, ``hf://``): a store only says where each attempt's request goes and with
which credentials (a :class:`Target`, built afresh so that tokens and signatures never go
stale), and how to read its own error code out of an error reply.

No ``curl`` subprocess: redirects, proxies from the environment and TLS come from
:mod:`urllib.request`. A redirect to another host (a CDN's presigned URL) does not carry the
``Authorization`` header. A server that ignores ``Range`` (answers 200 instead of 206) still
gives the right bytes: the stream discards what precedes the requested offset, and logs that it
did.

``https://user:password@host/...`` reads with HTTP basic authentication: the credentials go into
an ``Authorization`` header (kept from other hosts on redirects, like every store's), never into
the request line, and every message shows the URL redacted. A reply whose ``Content-Length`` or
``Content-Range`` is not what HTTP allows is an error naming the URL and the header; reads
return as soon as some bytes arrive, so a trickling server is judged by its rate
(:mod:`wdsx.sources.stall`) instead of blocking a whole read.
"""

from __future__ import annotations

import datetime
import email.utils
import functools
import http.client
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from typing import IO, Any
from urllib.parse import urlsplit

from wdsx.core.errors import SourceError
from wdsx.core.jsontext import parse_json
from wdsx.sources import replyheads
from wdsx.sources.base import Source, SourceOptions, read_up_to
from wdsx.sources.retry import (
    Response,
    ResumingSource,
    TransientError,
    content_range,
    empty_response,
    range_header,
    wanted_end,
)
from wdsx.sources.stall import read_timeout
from wdsx.sources.urls import split_userinfo

_RETRY_STATUSES = frozenset((408, 425, 429))
_ERROR_BODY_LIMIT = 4096


@dataclass(frozen=True)
class Target:
    """Where one request goes: the HTTP(S) URL and the headers that authorize it."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)


def plain_target(url: str) -> Target:
    """Where a request for a plain ``http(s)://`` URL goes: the URL without its userinfo, whose
    ``user:password`` (when present) becomes a basic ``Authorization`` header."""
    address, authorization = split_userinfo(url)
    return Target(address, {"Authorization": authorization} if authorization else {})


ErrorReader = Callable[[int, Message, bytes], tuple[str | None, str | None]]
"""The store's own error code and message, from an error reply's status, headers and body."""


def no_store_code(status: int, headers: Message, body: bytes) -> tuple[str | None, str | None]:
    """Plain HTTP servers have no error codes beyond the status."""
    return None, None


class _KeepCredentialsOnHost(urllib.request.HTTPRedirectHandler):
    """Follows redirects, but sends ``Authorization`` only to the host it was meant for."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urlsplit(newurl).netloc != urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    return urllib.request.build_opener(
        _KeepCredentialsOnHost, replyheads.HTTPHandler, replyheads.HTTPSHandler
    )


def http_request(
    url: str,
    target: Target,
    options: SourceOptions,
    doing: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
    read_error: ErrorReader = no_store_code,
    passthrough: tuple[int, ...] = (416,),
) -> http.client.HTTPResponse:
    """Send one request; a reply with an error status raises what it means.

    ``url`` is the one the user gave (named in errors); the request goes to ``target``. Network
    failures, 5xx, 408, 425 and 429 raise :class:`TransientError`; other error statuses raise
    :class:`SourceError` with the store's code. A status in ``passthrough`` is raised as the
    ``HTTPError`` itself (a reply with headers and a body), for the caller to interpret.
    """
    try:
        request = urllib.request.Request(
            target.url, data=data, headers={**target.headers, **(headers or {})}, method=method
        )
        return _opener().open(request, timeout=read_timeout(options))
    except (ValueError, http.client.InvalidURL) as exn:
        raise SourceError(url, f"{doing}: not a URL that can be requested: {exn}") from exn
    except urllib.error.HTTPError as exn:
        if exn.code in passthrough:
            raise
        said = describe_error(exn, read_error)
        if exn.code >= 500 or exn.code in _RETRY_STATUSES:
            raise TransientError(said, retry_after(exn.headers)) from exn
        raise SourceError(url, f"{doing}: {said}") from exn
    except (OSError, http.client.HTTPException) as exn:
        raise TransientError(f"{doing}: {getattr(exn, 'reason', None) or exn}") from exn


def retry_after(headers: Message | None) -> float | None:
    """The seconds a reply's ``Retry-After`` asks to wait (a number, or an HTTP date); None
    when it says nothing usable."""
    value = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    if _DIGITS.fullmatch(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):  # not a date, or one no datetime can hold
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def describe_error(exn: urllib.error.HTTPError, read_error: ErrorReader) -> str:
    """``"CODE (HTTP 404): message"`` with the store's code, else ``"HTTP 404 Not Found"``."""
    try:
        body = exn.read(_ERROR_BODY_LIMIT) or b""
    except (OSError, http.client.HTTPException):
        body = b""
    finally:
        exn.close()
    code, message = read_error(exn.code, exn.headers, body)
    said = f"{code} (HTTP {exn.code})" if code else f"HTTP {exn.code} {exn.reason}"
    return f"{said}: {message}" if message else said


class _HTTPBody:
    """A response body whose network failures surface as :class:`TransientError`."""

    def __init__(self, reply: http.client.HTTPResponse):
        self._reply = reply

    def read(self, n: int) -> bytes:
        try:
            return self._reply.read1(n)
        except (OSError, http.client.HTTPException) as exn:
            raise TransientError(f"{type(exn).__name__}: {exn}") from exn

    def close(self) -> None:
        self._reply.close()


def open_http(
    url: str,
    offset: int,
    options: SourceOptions,
    *,
    locate: Callable[[], Target] | None = None,
    read_error: ErrorReader = no_store_code,
    end: int | None = None,
) -> Source:
    """Stream ``url`` from ``offset`` (a ``Range: bytes=offset-`` GET when > 0), up to ``end``
    when given (``Range: bytes=offset-(end - 1)``, even from offset 0).

    ``locate`` gives each attempt's :class:`Target` (by default, ``url`` itself, its userinfo
    as a basic ``Authorization`` header); ``read_error`` reads the store's error code out of
    error replies.
    """
    where = locate or (lambda: plain_target(url))

    def connect(start: int, stop: int | None) -> Response:
        target = where()
        headers = {"Accept-Encoding": "identity"}
        wanted = range_header(start, stop)
        if wanted:
            headers["Range"] = wanted
        doing = f"GET from byte {start}"
        try:
            reply = http_request(url, target, options, doing, headers=headers, read_error=read_error)
        except urllib.error.HTTPError as exn:
            exn.close()
            return _past_end(url, start, exn.headers, lambda: _size(url, where(), options, read_error))
        try:
            first, total = _extent(url, reply, start)
        except SourceError:
            reply.close()
            raise
        return Response(_HTTPBody(reply), first, wanted_end(total, stop), reply.headers.get("ETag"))

    return ResumingSource(url, offset, options, connect, end)


def _size(url: str, target: Target, options: SourceOptions, read_error: ErrorReader) -> int | None:
    """The resource's size from a HEAD request, when the server says it."""
    reply = http_request(url, target, options, "HEAD", method="HEAD", read_error=read_error, passthrough=())
    with reply:
        return byte_count(url, reply.headers, "Content-Length")


def _extent(url: str, reply: http.client.HTTPResponse, start: int) -> tuple[int, int | None]:
    """The offset of the reply's first byte and where its bytes end (when it says): from its
    ``Content-Range`` (a 206; one left out means the range asked for) or ``Content-Length``.
    A 206 that does not give the resource's size (``bytes A-B/*``, or no ``Content-Range``)
    still says how long it is, so that a connection dropped before then is not taken for
    the end of the resource."""
    content_length = byte_count(url, reply.headers, "Content-Length")
    if reply.status != 206:
        return 0, content_length
    value = reply.headers.get("Content-Range")
    if value is None:
        return start, None if content_length is None else start + content_length
    extent = content_range(value)
    if extent is None:
        raise SourceError(
            url, f"malformed Content-Range header {_shown(value)} in a reply to a GET from byte {start}"
        )
    first, total = extent
    if total is None and content_length is not None:
        return first, first + content_length
    return extent


_DIGITS = re.compile(r"[0-9]{1,20}")


def byte_count(url: str, headers: Message, name: str) -> int | None:
    """The value of header ``name`` as a byte count (None when absent); a value that is not
    one (``abc``, ``-1``, ``1e9``, several values) is a :class:`SourceError` naming both."""
    value = headers.get(name)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise SourceError(url, f"malformed {name} header {_shown(value)}: not a byte count")
    return int(value)


def _shown(value: str) -> str:
    """A header's value as an error message shows it: quoted, and cut after 80 characters."""
    return repr(value[:80]) + ("..." if len(value) > 80 else "")


def _past_end(url: str, start: int, headers: Message, size_of: Callable[[], int | None]) -> Response:
    """No bytes for an offset at the very end; else an error naming the size.

    The size comes from the 416's ``Content-Range: bytes */SIZE``, or from a HEAD request when
    the server left that header out.
    """
    match = re.fullmatch(r"bytes \*/(\d+)", (headers.get("Content-Range") or "").strip())
    size = int(match.group(1)) if match else size_of()
    if size != start:
        known = f" ({size} bytes)" if size is not None else ""
        raise SourceError(url, f"offset {start} is past the end of the resource{known}")
    return empty_response(start)


def fetch_json(
    url: str, target: Target, options: SourceOptions, doing: str, read_error: ErrorReader = no_store_code
) -> tuple[Any, Message]:
    """The decoded JSON body of a GET (an API call) and the reply's headers."""
    reply = http_request(url, target, options, doing, read_error=read_error)
    with reply:
        try:
            body = read_up_to(reply.read1, options.max_companion_bytes)
        except (OSError, http.client.HTTPException) as exn:
            raise TransientError(f"{doing}: {type(exn).__name__}: {exn}") from exn
    if body is None:
        raise SourceError(url, f"{doing}: the reply is larger than {options.max_companion_bytes} bytes")
    try:
        return parse_json(body), reply.headers
    except ValueError as exn:
        raise SourceError(url, f"{doing}: the reply is not JSON: {body[:200]!r}") from exn


def json_error(body: bytes) -> dict[str, Any]:
    """The decoded JSON object of an error body, or ``{}`` when it is not one."""
    try:
        value = parse_json(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
