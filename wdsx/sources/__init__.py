"""Open shards by URL: local paths and ``file:``, ``s3://``, ``gs://``, ``az://``, ``hf://``,
``http(s)://``, ``pipe:``, and any other protocol fsspec knows.

Every opener takes the byte offset at which the caller wants to start. Stores that support it
start there directly (a seek or a ranged request); ``pipe:`` reads and discards up to it.
Openers registered as ``bounded`` also take an ``end`` keyword: a read of a known extent (one
sample, by index) then asks the store for exactly those bytes.
A scheme with no reader of its own is read through fsspec, when fsspec knows its protocol.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wdsx.core.env import secure_mode
from wdsx.core.errors import RefusedError, SourceError
from wdsx.core.extras import install_hint
from wdsx.sources.base import Sink, Source, SourceOptions
from wdsx.sources.listing import Lister, list_local, list_shards, missing_local_shards, names_several
from wdsx.sources.local import LocalSink, LocalSource, local_path
from wdsx.sources.stream import DeviceSource, is_stream_device

Opener = Callable[[str, int, SourceOptions], Source]
SinkOpener = Callable[[str, SourceOptions], Sink]

_OPENERS: dict[str, Opener] = {}
_SINK_OPENERS: dict[str, SinkOpener] = {}
_LISTERS: dict[str, Lister] = {}
_BOUNDED: set[str] = set()
"""Schemes whose opener takes ``end=`` (a bounded ``Range:`` request)."""
FALLBACK = "fsspec"
"""The pseudo-scheme whose reader and lister serve schemes that have none of their own."""
DEFAULT_OPTIONS = SourceOptions()


def register(
    scheme: str,
    opener: Opener | None = None,
    sink: SinkOpener | None = None,
    lister: Lister | None = None,
    *,
    bounded: bool = False,
) -> None:
    """Add a URL scheme (``"s3"``, ``"http"``...) with its reader and, optionally, its writer
    and its lister (which expands prefixes and globs). ``bounded``: the reader also takes an
    ``end=`` keyword, the offset at which the caller will stop reading."""
    if opener is not None:
        _OPENERS[scheme] = opener
        if bounded:
            _BOUNDED.add(scheme)
        else:
            _BOUNDED.discard(scheme)
    if sink is not None:
        _SINK_OPENERS[scheme] = sink
    if lister is not None:
        _LISTERS[scheme] = lister


@dataclass(frozen=True)
class Registration:
    """What :func:`register` holds for one scheme (None where it has no such part)."""

    opener: Opener | None
    sink: SinkOpener | None
    lister: Lister | None
    bounded: bool


def registered(scheme: str) -> Registration | None:
    """What is registered for ``scheme`` (wdsx's own stores included), or None if nothing is:
    a program that replaces a scheme's reader keeps this to put it back later."""
    _load_backends()
    parts = (_OPENERS.get(scheme), _SINK_OPENERS.get(scheme), _LISTERS.get(scheme))
    if parts == (None, None, None):
        return None
    return Registration(*parts, bounded=scheme in _BOUNDED)


def unregister(scheme: str) -> Registration | None:
    """Remove everything registered for ``scheme``; what was removed, or None if nothing was.
    Its URLs are then read as any unknown scheme's (through fsspec, if it knows the protocol)."""
    removed = registered(scheme)
    _OPENERS.pop(scheme, None)
    _SINK_OPENERS.pop(scheme, None)
    _LISTERS.pop(scheme, None)
    _BOUNDED.discard(scheme)
    return removed


_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*):(//)?")


def scheme_of(url: str) -> str:
    """``"file"`` for local paths, else the URL's scheme (``"pipe"`` for ``pipe:``).

    A scheme is what comes before ``://``; a ``name:`` without ``//`` (``mine:/data/x.tar``) is
    a scheme too when a reader is registered under that name, as webdataset's ``gopen`` reads
    it. Otherwise, such a URL is a local path (``C:/x.tar``, ``a:b.tar``); one-letter names are
    always paths (Windows drives).
    """
    if url.startswith("pipe:"):
        return "pipe"
    match = _SCHEME.match(url)
    if match is None:
        return "file"
    scheme = match.group(1).lower()
    if match.group(2) or (len(scheme) > 1 and scheme != "file" and _has_reader(scheme)):
        return scheme
    return "file"


def _has_reader(scheme: str) -> bool:
    _load_backends()
    return scheme in _OPENERS


def rewrite_url(url: str) -> str:
    """Apply webdataset's ``GOPEN_REWRITE="prefix=replacement;..."`` rules."""
    rules = os.environ.get("GOPEN_REWRITE")
    if not rules:
        return url
    if secure_mode():
        raise RefusedError(
            url,
            "rewrite_url: unsafe_gopen is False, cannot rewrite URLs using environment variables "
            "(GOPEN_REWRITE, in secure mode, WDS_SECURE=1)",
        )
    for rule in rules.split(";"):
        prefix, _, replacement = rule.partition("=")
        if prefix and url.startswith(prefix):
            return replacement + url[len(prefix) :]
    return url


def open_source(
    url: str,
    offset: int = 0,
    options: SourceOptions | None = None,
    *,
    sha256: str | None = None,
    end: int | None = None,
    size: int | None = None,
) -> Source:
    """Open the shard at ``url`` so that the first byte read is the one at ``offset``.

    ``end``: the caller reads no byte at or past it; a bounded store is then asked for exactly
    ``[offset, end)`` (one ``Range:`` request, even from offset 0; fsspec fetches in its own
    blocks, and its source stops at ``end``). With ``options.cache_dir``
    set, remote shards are read through the local cache; there, ``sha256`` (hex) is checked
    against each downloaded copy. Without a cache it is ignored.

    ``size``: the shard's size as recorded beforehand (a manifest's ``bytes``): a remote stream
    that goes on past it is a :class:`SourceError` instead of being read without end (with a
    cache, its download stops there too and keeps nothing).
    """
    source = _open(url, offset, options or DEFAULT_OPTIONS, sha256, end, size)
    if size is None or isinstance(source, LocalSource):
        return source
    from wdsx.sources.sized import SizedSource

    return SizedSource(source, offset, size)


def _open(
    url: str, offset: int, options: SourceOptions, sha256: str | None, end: int | None, size: int | None
) -> Source:
    url = rewrite_url(url)
    scheme = scheme_of(url)
    if scheme == "file":
        path = local_path(url) or url
        if is_stream_device(path):
            return DeviceSource(url, path, offset, options)
        return LocalSource(url, path, offset)
    opener = _handler(_OPENERS, scheme)
    if opener is None:
        hint = install_hint("fsspec", "fsspec")
        raise SourceError(url, f"no reader for URL scheme {scheme!r}, nor an fsspec filesystem ({hint})")
    if options.cache_dir:
        from wdsx.sources.cache import open_cached

        return open_cached(url, offset, options, opener, sha256, size)
    if end is not None and (scheme in _BOUNDED or (scheme not in _OPENERS and FALLBACK in _BOUNDED)):
        bounded: Callable[..., Source] = opener
        return bounded(url, offset, options, end=end)
    return opener(url, offset, options)


def open_sink(url: str, options: SourceOptions | None = None) -> Sink:
    """Open ``url`` for writing a whole shard; it appears under its name only on commit."""
    options = options or DEFAULT_OPTIONS
    url = rewrite_url(url)
    scheme = scheme_of(url)
    if scheme == "file":
        return LocalSink(url, local_path(url) or url)
    _load_backends()
    sink = _SINK_OPENERS.get(scheme)
    if sink is None:
        raise SourceError(url, f"no writer for URL scheme {scheme!r}")
    return sink(url, options)


def lister_for(url: str) -> Lister | None:
    """What expands prefixes and globs of ``url``'s scheme (local paths too); None for schemes
    that cannot list."""
    scheme = scheme_of(url)
    if scheme == "file":
        return list_local
    return _handler(_LISTERS, scheme)


def _handler(table: dict[str, Any], scheme: str) -> Any:
    """``table``'s entry for ``scheme``; the fsspec fallback's for a scheme with no reader."""
    _load_backends()
    if scheme in _OPENERS:
        return table.get(scheme)
    if FALLBACK in table and scheme not in ("file", "pipe"):
        try:
            from wdsx.sources.fsspec_store import knows_protocol
        except ImportError:
            return None
        if knows_protocol(scheme):
            return table[FALLBACK]
    return None


_loaded = False


def _load_backends() -> None:
    """Import the remote backends on first use, so ``import wdsx`` stays light."""
    global _loaded
    if not _loaded:
        # Marked loaded only once imported: a thread racing this one waits on the import lock.
        from wdsx.sources import backends  # noqa: F401  (registers the remote schemes)

        _loaded = True


__all__ = [
    "Sink",
    "Source",
    "SourceOptions",
    "LocalSink",
    "LocalSource",
    "list_shards",
    "lister_for",
    "missing_local_shards",
    "names_several",
    "local_path",
    "open_sink",
    "open_source",
    "register",
    "registered",
    "Registration",
    "rewrite_url",
    "scheme_of",
    "unregister",
]
