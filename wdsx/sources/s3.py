"""``s3://bucket/key`` through boto3: ranged GETs that resume where they stopped, multipart writes.

Credentials and the endpoint come from boto3's usual chain (environment, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL`` for S3-compatible stores such as SeaweedFS or MinIO), overridden by the
keyword arguments in ``SourceOptions.s3``. That dict may also hold ``profile_name`` (for the
session) and ``config``, a dict of ``botocore.config.Config`` arguments in which
``signature_version="unsigned"`` reads public buckets anonymously.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import botocore
import botocore.exceptions
import urllib3.exceptions
from botocore.config import Config

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.buckets import object_of, split_bucket_url
from wdsx.sources.clients import ClientCache
from wdsx.sources.parts import PART_SIZE, PartedSink
from wdsx.sources.retry import (
    Response,
    ResumingSource,
    TransientError,
    call_with_retries,
    content_range,
    empty_response,
    range_header,
    wanted_end,
)
from wdsx.sources.stall import read_timeout

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
_clients = ClientCache(("AWS_",))


def s3_client(options: SourceOptions) -> Any:
    """The boto3 S3 client for these options, created once per process (see :class:`ClientCache`)."""

    def make() -> Any:
        kwargs = dict(options.s3)
        session = boto3.session.Session(profile_name=kwargs.pop("profile_name", None))
        return session.client("s3", config=_client_config(options, kwargs.pop("config", None)), **kwargs)

    return _clients.get((sorted(options.s3.items()), options.timeout, read_timeout(options)), make)


def _client_config(options: SourceOptions, extra: dict[str, Any] | Config | None) -> Config:
    """Timeouts from the options (a read waits at most the stall window); no retries inside
    botocore, since wdsx retries by byte offset.

    botocore's whole-response checksum is off for reads: a read resumed with ranged GETs is
    never one whole response. (The cache checks a sha256 when one is given.)
    """
    config = Config(
        connect_timeout=options.timeout,
        read_timeout=read_timeout(options),
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
    """A GetObject body whose network failures surface as :class:`TransientError`.

    Reads return as soon as some bytes arrive (urllib3's ``read1``), so a trickling reply is
    judged by its rate instead of blocking until a whole read fills. (botocore's own check of
    the length is not needed: a reply that ends short is resumed where it stopped.)"""

    def __init__(self, url: str, stream: Any):
        self._url = url
        self._stream = stream
        raw = getattr(stream, "_raw_stream", None)
        self._read = getattr(raw, "read1", None) or stream.read

    def read(self, n: int) -> bytes:
        with s3_errors(self._url, "reading"):
            return bytes(self._read(n))

    def close(self) -> None:
        self._stream.close()


def open_s3(url: str, offset: int, options: SourceOptions, *, end: int | None = None) -> Source:
    """Stream ``s3://bucket/key`` from ``offset`` (a ``Range: bytes=offset-`` GET when > 0), up
    to ``end`` when given (a bounded range, even from offset 0)."""
    bucket, key = object_of(url)
    client = s3_client(options)

    def connect(start: int, stop: int | None) -> Response:
        request: dict[str, Any] = {"Bucket": bucket, "Key": key}
        wanted = range_header(start, stop)
        if wanted:
            request["Range"] = wanted
        try:
            with s3_errors(url, f"GetObject from byte {start}"):
                reply = client.get_object(**request)
        except SourceError as exn:
            if error_code(exn.__cause__) != "InvalidRange":
                raise
            return _past_end(start)
        first, total = content_range(reply.get("ContentRange")) or (0, reply.get("ContentLength"))
        return Response(_S3Body(url, reply["Body"]), first, wanted_end(total, stop), reply.get("ETag"))

    def _past_end(start: int) -> Response:
        """An empty response for an offset at the very end; an error for one beyond it."""
        with s3_errors(url, "HeadObject"):
            size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        if start != size:
            raise SourceError(url, f"offset {start} is past the end of the object ({size} bytes)")
        return empty_response(start)

    return ResumingSource(url, offset, options, connect, end)


def list_s3(prefix: str, options: SourceOptions) -> list[str]:
    """Every ``s3://`` object URL starting with ``prefix``, page by page."""
    bucket, key_prefix = split_bucket_url(prefix)
    keys: list[str] = []
    with s3_errors(prefix, f"ListObjectsV2 with prefix {key_prefix!r}"):
        pages = s3_client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key_prefix)
        for page in pages:
            keys.extend(item["Key"] for item in page.get("Contents", ()))
    return [f"s3://{bucket}/{key}" for key in keys]


class S3Sink(PartedSink):
    """Uploads a shard in parts; the object appears only when :meth:`commit` completes the upload.

    A shard smaller than ``part_size`` is written with a single PutObject at commit.
    :meth:`abort` aborts the multipart upload, so no partial object is ever visible.
    """

    def __init__(self, url: str, options: SourceOptions, part_size: int = PART_SIZE):
        super().__init__(url, part_size)
        self.options = options
        self.bucket, self.key = object_of(url)
        self._client = s3_client(options)
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []

    def _call(self, doing: str, method: str, **request: Any) -> dict[str, Any]:
        def attempt() -> dict[str, Any]:
            with s3_errors(self.url, doing):
                return getattr(self._client, method)(Bucket=self.bucket, Key=self.key, **request)

        return call_with_retries(self.url, self.options, doing, attempt)

    def _upload_part(self, data: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self._call("CreateMultipartUpload", "create_multipart_upload")["UploadId"]
        number = len(self._parts) + 1
        reply = self._call(
            f"UploadPart {number}", "upload_part", UploadId=self._upload_id, PartNumber=number, Body=data
        )
        self._parts.append({"PartNumber": number, "ETag": reply["ETag"]})

    def _finish(self, rest: bytes) -> None:
        if self._upload_id is None:
            self._call("PutObject", "put_object", Body=rest)
            return
        if rest:
            self._upload_part(rest)
        self._call(
            "CompleteMultipartUpload",
            "complete_multipart_upload",
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )

    def _discard(self) -> None:
        if self._upload_id is not None:
            self._call("AbortMultipartUpload", "abort_multipart_upload", UploadId=self._upload_id)
