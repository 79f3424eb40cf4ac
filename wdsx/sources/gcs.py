"""``gs://bucket/key`` (and ``gcs://``) on Google Cloud Storage, through google-cloud-storage.

The official client resolves the credentials (Application Default Credentials:
``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``, the metadata
server; anonymous when there are none, or with ``STORAGE_EMULATOR_HOST`` set) and the endpoint,
lists objects and starts resumable uploads. Reads are streamed ranged GETs of the object's
media URL through wdsx's HTTP reader, authorized with those credentials: against a local
emulator that streamed more than three times the bytes per second of the client's own chunked
reads (``Blob.open``) and of gcsfs, and a dropped connection loses only what was in flight.

``SourceOptions.gcs`` may hold ``endpoint_url`` (an emulator or private endpoint), ``project``
and ``anonymous=True`` (public buckets, no credentials looked up).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from typing import Any
from urllib.parse import quote

import google.api_core.exceptions
import google.auth
import google.auth.exceptions
import google.auth.transport.requests
import requests.exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.buckets import object_of, split_bucket_url
from wdsx.sources.clients import ClientCache
from wdsx.sources.http import Target, http_request, json_error, open_http
from wdsx.sources.parts import PART_SIZE, PartedSink
from wdsx.sources.retry import Attempts, TransientError, call_with_retries

log = logging.getLogger("wdsx")

_SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_UPLOAD_UNIT = 256 << 10
"""Every part of a resumable upload but the last is a multiple of this many bytes."""
_NETWORK_ERRORS = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    google.auth.exceptions.TransportError,
    OSError,
)
_clients = ClientCache(("STORAGE_EMULATOR_HOST", "GOOGLE_", "API_ENDPOINT_OVERRIDE"))


class GCSAccess:
    """The storage client, the credentials it resolved and the endpoint it talks to."""

    def __init__(self, settings: dict[str, Any]):
        self.credentials, project = _credentials(settings)
        endpoint = settings.get("endpoint_url")
        self.client = storage.Client(
            project=settings.get("project", project),
            credentials=self.credentials,
            client_options={"api_endpoint": endpoint} if endpoint else None,
        )
        self.endpoint = str(self.client.api_endpoint).rstrip("/")
        self._lock = threading.Lock()
        self._auth_request = google.auth.transport.requests.Request()

    def target(self, url: str) -> Target:
        """``url`` with an ``Authorization`` header from fresh (refreshed when expired) credentials."""
        headers: dict[str, str] = {}
        with self._lock:
            self.credentials.before_request(self._auth_request, "GET", url, headers)
        return Target(url, headers)


def _credentials(settings: dict[str, Any]) -> tuple[Any, str | None]:
    """Application Default Credentials, or anonymous ones for emulators and public buckets."""
    if settings.get("anonymous") or os.environ.get("STORAGE_EMULATOR_HOST"):
        return AnonymousCredentials(), None
    try:
        return google.auth.default(scopes=_SCOPES)
    except google.auth.exceptions.DefaultCredentialsError:
        log.info("gs://: no Google credentials found; reading anonymously (public buckets only)")
        return AnonymousCredentials(), None


def gcs_access(options: SourceOptions) -> GCSAccess:
    """The :class:`GCSAccess` for these options, made once per process."""
    return _clients.get(sorted(options.gcs.items()), lambda: GCSAccess(dict(options.gcs)))


def read_gcs_error(status: int, headers: Message, body: bytes) -> tuple[str | None, str | None]:
    """The JSON API's reason (``notFound``...), else the client library's name for the status."""
    error = json_error(body).get("error")
    if isinstance(error, dict):
        reasons = [item.get("reason") for item in error.get("errors", ()) if isinstance(item, dict)]
        code = next((reason for reason in reasons if reason), None) or error.get("status")
        return code or _status_name(status), error.get("message")
    text = body.decode("utf-8", "replace").strip()
    return _status_name(status), text[:300] or None


def _status_name(status: int) -> str:
    return type(google.api_core.exceptions.from_http_status(status, "")).__name__


@contextmanager
def gcs_errors(url: str, doing: str) -> Iterator[None]:
    """Turn the client library's exceptions into :class:`TransientError` or :class:`SourceError`."""
    try:
        yield
    except SourceError:
        raise
    except google.api_core.exceptions.GoogleAPICallError as exn:
        status = exn.code or 0
        said = f"{exn.reason or type(exn).__name__} (HTTP {status}): {exn.message}"
        if status >= 500 or status in (408, 429) or not status:
            raise TransientError(said) from exn
        raise SourceError(url, f"{doing}: {said}") from exn
    except _NETWORK_ERRORS as exn:
        raise TransientError(f"{doing}: {type(exn).__name__}: {exn}") from exn
    except google.auth.exceptions.GoogleAuthError as exn:
        raise SourceError(url, f"{doing}: {type(exn).__name__}: {exn}") from exn


def _media_url(access: GCSAccess, bucket: str, key: str) -> str:
    return (
        f"{access.endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(key, safe='')}?alt=media"
    )


def open_gcs(url: str, offset: int, options: SourceOptions, *, end: int | None = None) -> Source:
    """Stream ``gs://bucket/key`` from ``offset`` (a ``Range: bytes=offset-`` GET when > 0), up
    to ``end`` when given."""
    bucket, key = object_of(url)
    access = gcs_access(options)
    media = _media_url(access, bucket, key)
    return open_http(
        url, offset, options, locate=lambda: access.target(media), read_error=read_gcs_error, end=end
    )


def list_gcs(prefix: str, options: SourceOptions) -> list[str]:
    """Every object URL starting with ``prefix`` (``gs://bucket/data/train-``), page by page."""
    scheme = prefix.partition("://")[0]
    bucket, key_prefix = split_bucket_url(prefix)
    client = gcs_access(options).client
    with gcs_errors(prefix, f"listing objects with prefix {key_prefix!r}"):
        blobs = client.list_blobs(
            bucket,
            prefix=key_prefix,
            fields="items(name),nextPageToken",
            timeout=options.timeout,
            retry=None,
        )
        return [f"{scheme}://{bucket}/{blob.name}" for blob in blobs]


class GCSSink(PartedSink):
    """Writes a shard with a resumable upload; the object appears only when :meth:`commit`
    sends the last part with the total size.

    A failed part is retried from the first byte the service has not persisted (it says which
    when asked). :meth:`abort` cancels the upload session.
    """

    def __init__(self, url: str, options: SourceOptions, part_size: int = PART_SIZE):
        if part_size <= 0 or part_size % _UPLOAD_UNIT:
            raise ValueError(f"{url}: part_size must be a positive multiple of {_UPLOAD_UNIT} bytes")
        super().__init__(url, part_size)
        self.options = options
        bucket, key = object_of(url)
        self._blob = gcs_access(options).client.bucket(bucket).blob(key)
        self._session: str | None = None
        self._persisted = 0

    def _upload_part(self, data: bytes) -> None:
        self._send(data, None)

    def _finish(self, rest: bytes) -> None:
        self._send(rest, self._persisted + len(rest))

    def _discard(self) -> None:
        if self._session is None:
            return
        try:
            http_request(
                self.url,
                Target(self._session),
                self.options,
                "cancelling the upload",
                method="DELETE",
                passthrough=(499,),
            ).close()
        except urllib.error.HTTPError as exn:
            exn.close()
        except (TransientError, SourceError) as exn:
            log.warning(
                "%s: could not cancel the unfinished upload (it expires by itself): %s", self.url, exn
            )

    def _start(self) -> str:
        def attempt() -> str:
            with gcs_errors(self.url, "starting a resumable upload"):
                return str(
                    self._blob.create_resumable_upload_session(
                        content_type="application/x-tar",
                        timeout=self.options.timeout,
                        checksum=None,
                        retry=None,
                    )
                )

        return call_with_retries(self.url, self.options, "starting a resumable upload", attempt)

    def _send(self, data: bytes, total: int | None) -> None:
        """Upload ``data``, the bytes after those persisted; with ``total``, complete the object."""
        if self._session is None:
            self._session = self._start()
        first = self._persisted
        attempts = Attempts(self.url, self.options)
        unsure = False
        while True:
            try:
                if unsure:
                    persisted = self._put(b"", total)
                    if persisted is None:
                        return
                    self._persisted = persisted
                    unsure = False
                persisted = self._put(data[self._persisted - first :], total)
            except TransientError as exn:
                attempts.failed(exn, f"uploading from byte {self._persisted}")
                unsure = True
                continue
            if persisted is None:
                return
            if persisted <= self._persisted:
                attempts.failed(TransientError(f"nothing persisted after byte {persisted}"), "uploading")
            else:
                attempts.succeeded()
            self._persisted = persisted
            if persisted >= first + len(data) and total is None:
                return

    def _put(self, chunk: bytes, total: int | None) -> int | None:
        """Send ``chunk`` at the persisted offset (an empty one asks how much is persisted).

        Returns how many bytes the service has persisted, or None once the object is complete.
        """
        assert self._session is not None
        first = self._persisted
        size = "*" if total is None else str(total)
        span = f"bytes {first}-{first + len(chunk) - 1}/{size}" if chunk else f"bytes */{size}"
        try:
            reply = http_request(
                self.url,
                Target(self._session),
                self.options,
                f"uploading from byte {first}",
                method="PUT",
                data=chunk,
                headers={"Content-Range": span, "Content-Type": "application/octet-stream"},
                read_error=read_gcs_error,
                passthrough=(308,),
            )
        except urllib.error.HTTPError as exn:
            with exn:
                persisted = re.fullmatch(r"bytes=0-(\d+)", (exn.headers.get("Range") or "").strip())
            return int(persisted.group(1)) + 1 if persisted else 0
        with reply:
            reply.read()
        return None
