"""``hf://datasets/owner/name/path`` on the Hugging Face Hub, through its HTTP ``resolve`` endpoint.

``hf://datasets/owner/name@revision/path/to/shard.tar`` reads
``{endpoint}/datasets/owner/name/resolve/{revision}/path/to/shard.tar`` with wdsx's HTTP reader
(ranged GETs, resuming retries); ``hf://spaces/...`` and ``hf://owner/name/...`` (a model repo)
work the same way. The revision defaults to ``main``; a branch or tag with a slash is written
URL-encoded (``@refs%2Fpr%2F1``), or as ``@refs/pr/1``.

The endpoint is ``SourceOptions.hf["endpoint"]``, else ``HF_ENDPOINT``, else
https://huggingface.co. The token is ``SourceOptions.hf["token"]`` (``None`` for none), else
``HF_TOKEN``, else the Hub client's token file (``HF_TOKEN_PATH``, else ``$HF_HOME/token``,
``~/.cache/huggingface/token`` by default). It is sent only to the endpoint's host, never to
the CDN a large file redirects to. Listing uses the Hub's tree API.
"""

from __future__ import annotations

import os
import re
import urllib.error
from dataclasses import dataclass
from email.message import Message
from urllib.parse import quote, unquote

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.http import Target, fetch_json, open_http

DEFAULT_ENDPOINT = "https://huggingface.co"
_URL = re.compile(
    r"hf://(?:(?P<kind>datasets|spaces|models)/)?(?P<repo>[^/@]+/[^/@]+)"
    r"(?:@(?P<revision>refs/(?:pr|convert)/[^/]+|[^/]+))?(?:/(?P<path>.*))?"
)
_NEXT_PAGE = re.compile(r'<([^>]+)>;\s*rel="next"')


@dataclass(frozen=True)
class HubPath:
    """A file (or a path prefix) in a Hub repository."""

    kind: str
    """``"datasets"``, ``"spaces"`` or ``"models"``."""
    repo: str
    revision: str
    path: str
    base: str
    """The ``hf://`` URL up to the path, as written."""

    def url_prefix(self, endpoint: str) -> str:
        """``{endpoint}/datasets/owner/name`` (no ``models/`` for models)."""
        return f"{endpoint}/{'' if self.kind == 'models' else self.kind + '/'}{self.repo}"


def split_hf_url(url: str) -> HubPath:
    """The repository, revision and path an ``hf://`` URL names."""
    match = _URL.fullmatch(url)
    if not match:
        raise SourceError(
            url, "an hf:// URL names a repository and a path: hf://datasets/owner/name[@revision]/path"
        )
    path = match.group("path") or ""
    return HubPath(
        match.group("kind") or "models",
        match.group("repo"),
        unquote(match.group("revision") or "main"),
        path,
        url[: len(url) - len(path)] if path else url.rstrip("/") + "/",
    )


def hub_endpoint(options: SourceOptions) -> str:
    return str(options.hf.get("endpoint") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def hub_token(options: SourceOptions) -> str | None:
    """The token from the options, ``HF_TOKEN``, or the Hub client's token file; None if none."""
    if "token" in options.hf:
        return options.hf["token"] or None
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    try:
        with open(os.environ.get("HF_TOKEN_PATH") or os.path.join(home, "token")) as stream:
            return stream.read().strip() or None
    except FileNotFoundError:
        return None


def _target(address: str, token: str | None) -> Target:
    return Target(address, {"Authorization": f"Bearer {token}"} if token else {})


def read_hub_error(status: int, headers: Message, body: bytes) -> tuple[str | None, str | None]:
    """The Hub's ``X-Error-Code`` (``RepoNotFound``, ``EntryNotFound``...) and ``X-Error-Message``."""
    return headers.get("X-Error-Code"), headers.get("X-Error-Message")


def open_hf(url: str, offset: int, options: SourceOptions, *, end: int | None = None) -> Source:
    """Stream an ``hf://`` file from ``offset`` (a ``Range: bytes=offset-`` GET when > 0), up to
    ``end`` when given."""
    where = split_hf_url(url)
    if not where.path or where.path.endswith("/"):
        raise SourceError(url, "an hf:// URL of a shard needs a file path after the repository")
    revision = quote(where.revision, safe="")
    address = f"{where.url_prefix(hub_endpoint(options))}/resolve/{revision}/{quote(where.path)}"
    token = hub_token(options)
    return open_http(
        url, offset, options, locate=lambda: _target(address, token), read_error=read_hub_error, end=end
    )


def list_hf(prefix: str, options: SourceOptions) -> list[str]:
    """Every file URL starting with ``prefix``, from the tree API (page by page)."""
    where = split_hf_url(prefix)
    directory = where.path.rpartition("/")[0]
    address: str | None = (
        f"{hub_endpoint(options)}/api/{where.kind}/{where.repo}/tree/{quote(where.revision, safe='')}"
        f"/{quote(directory)}?recursive=true&expand=false"
    )
    token = hub_token(options)
    urls: list[str] = []
    while address:
        try:
            entries, headers = fetch_json(prefix, _target(address, token), options, "listing", read_hub_error)
        except SourceError as exn:
            if _missing_directory(exn):
                return []
            raise
        link = headers.get("Link") or ""
        urls.extend(where.base + entry["path"] for entry in entries if entry.get("type") == "file")
        found = _NEXT_PAGE.search(link)
        address = found.group(1) if found else None
    return urls


def _missing_directory(exn: SourceError) -> bool:
    """Whether listing failed only because the directory does not exist (nothing to list)."""
    cause = exn.__cause__
    return isinstance(cause, urllib.error.HTTPError) and cause.headers.get("X-Error-Code") == "EntryNotFound"
