"""``s3://bucket/key`` through boto3: ranged GETs that resume where they stopped, multipart writes.

Credentials and the endpoint come from boto3's usual chain (environment, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL`` for S3-compatible stores such as SeaweedFS or MinIO), overridden by the
keyword arguments in ``SourceOptions.s3``. That dict may also hold ``profile_name`` (for the
session) and ``config``, a dict of ``botocore.config.Config`` arguments in which
``signature_version="unsigned"`` reads public buckets anonymously.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import botocore
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from wdsx.core.errors import SourceError
from wdsx.sources.base import Sink, Source, SourceOptions
from wdsx.sources.retry import (
    Response,
    ResumingSource,
    TransientError,
    call_with_retries,
    content_range,
    empty_response,
)

PART_SIZE = 16 << 20
"""Bytes per part of a multipart upload; a shard smaller than this is written with one PUT."""

_TRANSIENT_CODES = frozenset(
    ("SlowDown", "RequestTimeout", "InternalError", "ServiceUnavailable", "Throttling", "ThrottlingException")
)
_NETWORK_ERRORS = (
    botocore.exceptions.HTTPClientError,
    botocore.exceptions.ConnectionError,
    botocore.exceptions.IncompleteReadError,
    urllib3.exceptions.HTTPError,
    OSError,
)
_clients: dict[tuple[int, str], Any] = {}
_clients_lock = threading.Lock()


def _forget_clients_after_fork() -> None:
    """A forked child makes its own clients; a lock held by a parent's thread would never open."""
    global _clients_lock
    _clients_lock = threading.Lock()
    _clients.clear()


os.register_at_fork(after_in_child=_forget_clients_after_fork)


def split_s3_url(url: str) -> tuple[str, str]:
    """``("bucket", "path/to/key")`` from ``s3://bucket/path/to/key``."""
    bucket, _, key = url[len("s3://") :].partition("/")
    if not bucket:
        raise SourceError(url, "an s3:// URL needs a bucket name: s3://bucket/key")
    return bucket, key


def _object(url: str) -> tuple[str, str]:
    """Bucket and key of a URL that must name one object."""
    bucket, key = split_s3_url(url)
    if not key:
        raise SourceError(url, "an s3:// URL of a shard needs a key: s3://bucket/key")
    return bucket, key


def s3_client(options: SourceOptions) -> Any:
    """The boto3 S3 client for these options, created once per process.

    Clients are keyed by process id so that DataLoader workers forked from a process that
    already read from S3 open their own connections instead of sharing its sockets, and by the
    ``AWS_*`` environment, which boto3 reads when it creates a client.
    """
    environment = sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_"))
    key = (os.getpid(), repr((sorted(options.s3.items()), options.timeout, environment)))
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            kwargs = dict(options.s3)
            session = boto3.session.Session(profile_name=kwargs.pop("profile_name", None))
            client = session.client(
                "s3", config=_client_config(options, kwargs.pop("config", None)), **kwargs
            )
            _clients[key] = client
        return client


def _client_config(options: SourceOptions, extra: dict[str, Any] | Config | None) -> Config:
    """Timeouts from the options; no retries inside botocore, since wdsx retries by byte offset.

    botocore's whole-response checksum is off for reads: a read resumed with ranged GETs is
    never one whole response. (The cache checks a sha256 when one is given.)
    """
    config = Config(
        connect_timeout=options.timeout,
        read_timeout=options.timeout,
        retries={"total_max_attempts": 1},
        max_pool_connections=32,
        response_checksum_validation="when_required",
    )
    if isinstance(extra, dict):
        extra = dict(extra)
        if extra.get("signature_version") == "unsigned":
            extra["signature_version"] = botocore.UNSIGNED
        extra = Config(**extra)
    return config.merge(extra) if extra is not None else config


def error_code(exn: BaseException | None) -> str | None:
    """The S3 error code (``NoSuchKey``, ``AccessDenied``...) of a boto3 ``ClientError``."""
    if isinstance(exn, botocore.exceptions.ClientError):
        return exn.response.get("Error", {}).get("Code", "unknown error")
    return None


@contextmanager
def s3_errors(url: str, doing: str) -> Iterator[None]:
    """Turn boto3's exceptions into :class:`TransientError` (retry) or :class:`SourceError`."""
    try:
        yield
    except SourceError:
        raise
    except botocore.exceptions.ClientError as exn:
        error = exn.response.get("Error", {})
        code = error_code(exn)
        status = exn.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        said = f"{code} (HTTP {status})" + (f": {error['Message']}" if error.get("Message") else "")
        if status >= 500 or code in _TRANSIENT_CODES:
            raise TransientError(said) from exn
        raise SourceError(url, f"{doing}: {said}") from exn
    except botocore.exceptions.SSLError as exn:
        raise SourceError(url, f"{doing}: {exn}") from exn
    except _NETWORK_ERRORS as exn:
        raise TransientError(f"{type(exn).__name__}: {exn}") from exn
    except botocore.exceptions.BotoCoreError as exn:
        raise SourceError(url, f"{doing}: {exn}") from exn


class _S3Body:
    """A GetObject body whose network failures surface as :class:`TransientError`."""

    def __init__(self, url: str, stream: Any):
        self._url = url
        self._stream = stream

    def read(self, n: int) -> bytes:
        with s3_errors(self._url, "reading"):
            return self._stream.read(n)

    def close(self) -> None:
        self._stream.close()


def open_s3(url: str, offset: int, options: SourceOptions) -> Source:
    """Stream ``s3://bucket/key`` from ``offset`` (a ``Range: bytes=offset-`` GET when > 0)."""
    bucket, key = _object(url)
    client = s3_client(options)

    def connect(start: int) -> Response:
        request: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if start:
            request["Range"] = f"bytes={start}-"
        try:
            with s3_errors(url, f"GetObject from byte {start}"):
                reply = client.get_object(**request)
        except SourceError as exn:
            if error_code(exn.__cause__) != "InvalidRange":
                raise
            return _past_end(start)
        first, total = content_range(reply.get("ContentRange")) or (0, reply.get("ContentLength"))
        return Response(_S3Body(url, reply["Body"]), first, total, reply.get("ETag"))

    def _past_end(start: int) -> Response:
        """An empty response for an offset at the very end; an error for one beyond it."""
        with s3_errors(url, "HeadObject"):
            size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        if start != size:
            raise SourceError(url, f"offset {start} is past the end of the object ({size} bytes)")
        return empty_response(start)

    return ResumingSource(url, offset, options, connect)


class S3Sink(Sink):
    """Uploads a shard in parts; the object appears only when :meth:`commit` completes the upload.

    A shard smaller than ``part_size`` is written with a single PutObject at commit.
    :meth:`abort` aborts the multipart upload, so no partial object is ever visible.
    """

    def __init__(self, url: str, options: SourceOptions, part_size: int = PART_SIZE):
        self.url = url
        self.options = options
        self.bucket, self.key = _object(url)
        self.part_size = part_size
        self._client = s3_client(options)
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._finished = False

    def _call(self, doing: str, method: str, **request: Any) -> dict[str, Any]:
        def attempt() -> dict[str, Any]:
            with s3_errors(self.url, doing):
                return getattr(self._client, method)(Bucket=self.bucket, Key=self.key, **request)

        return call_with_retries(self.url, self.options, doing, attempt)

    def write(self, data: bytes) -> int:
        if self._finished:
            raise ValueError(f"{self.url}: write after commit or abort")
        self._buffer += data
        while len(self._buffer) >= self.part_size:
            self._upload_part(bytes(self._buffer[: self.part_size]))
            del self._buffer[: self.part_size]
        return len(data)

    def _upload_part(self, data: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self._call("CreateMultipartUpload", "create_multipart_upload")["UploadId"]
        number = len(self._parts) + 1
        reply = self._call(
            f"UploadPart {number}", "upload_part", UploadId=self._upload_id, PartNumber=number, Body=data
        )
        self._parts.append({"PartNumber": number, "ETag": reply["ETag"]})

    def commit(self) -> None:
        if self._finished:
            return
        try:
            if self._upload_id is None:
                self._call("PutObject", "put_object", Body=bytes(self._buffer))
            else:
                if self._buffer:
                    self._upload_part(bytes(self._buffer))
                self._call(
                    "CompleteMultipartUpload",
                    "complete_multipart_upload",
                    UploadId=self._upload_id,
                    MultipartUpload={"Parts": self._parts},
                )
        except BaseException:
            self.abort()
            raise
        self._finished = True
        self._buffer = bytearray()

    def abort(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._buffer = bytearray()
        if self._upload_id is not None:
            self._call("AbortMultipartUpload", "abort_multipart_upload", UploadId=self._upload_id)
