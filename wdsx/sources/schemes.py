"""webdataset's ``gopen_schemes`` table and its per-scheme openers, over wdsx's sources.

In webdataset, ``gopen_schemes`` maps a URL scheme to ``opener(url, mode="rb", bufsize=8192,
**kw)``, a function returning a file object, and programs add entries to it to read shards
from their own stores. Here the table starts with webdataset's entries, which describe
webdataset's defaults (wdsx reads those schemes with its own sources: ranged reads, retries
that resume, a cache). An entry a program **sets** is registered with wdsx's sources
(:func:`wdsx.sources.register`), so ``wdsx.gopen(url)`` and ``WebDataset(urls)`` open URLs of
that scheme with it. Deleting a program's entry gives the scheme back to wdsx's own reader
(and the table its webdataset entry, if it had one).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, MutableMapping
from typing import IO, Any
from urllib.parse import urlparse

from wdsx.core.env import secure_mode
from wdsx.sources import Opener, Registration, SinkOpener, register, registered, unregister
from wdsx.sources.base import Sink, Source, SourceOptions
from wdsx.sources.commandpipe import Pipe
from wdsx.sources.local import local_path
from wdsx.sources.pipe import SECURE_MODE_REFUSAL

FileOpener = Callable[..., Any]
"""webdataset's opener: ``opener(url, mode="rb", bufsize=8192, **kw)`` returns a file object."""

_READ_IGNORED = (141, 23)
"""Exit statuses of a reading command that are not errors: SIGPIPE (the reader stopped
early), and curl's "write error" for the same reason."""
_WRITE_IGNORED = (141, 26)


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Open a local path or ``file:`` URL."""
    return open(local_path(url) or url, mode)  # noqa: SIM115 - the caller closes it


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Run the shell command after ``pipe:``; refused in secure mode (``WDS_SECURE=1``)."""
    if not url.startswith("pipe:"):
        raise ValueError(f"{url}: not a pipe: URL")
    if secure_mode():
        raise ValueError(SECURE_MODE_REFUSAL)
    if mode[:1] not in ("r", "w"):
        raise ValueError(f"{mode}: unknown mode")
    return Pipe(url[len("pipe:") :], mode=mode, shell=True, bufsize=bufsize, ignore_status=[141])


def _command(mode: str, bufsize: int, read: list[str], write: list[str] | None) -> Pipe:
    """A :class:`Pipe` running ``read`` or ``write`` depending on ``mode``."""
    if mode[:1] == "r":
        return Pipe(read, mode=mode, bufsize=bufsize, ignore_status=list(_READ_IGNORED))
    if mode[:1] == "w":
        if write is None:
            raise ValueError(f"{mode}: cannot write")
        return Pipe(write, mode=mode, bufsize=bufsize, ignore_status=list(_WRITE_IGNORED))
    raise ValueError(f"{mode}: unknown mode")


def gopen_curl(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Download (or ``PUT``) ``url`` with ``curl``, retrying as webdataset does."""
    retrying = ["--connect-timeout", "30", "--retry", "30", "--retry-delay", "2"]
    return _command(
        mode,
        bufsize,
        ["curl", *retrying, "-f", "-s", "-L", url],
        ["curl", "-f", "-s", "-X", "PUT", "-L", "-T", "-", url],
    )


def gopen_htgs(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read an ``htgs://`` URL: ``gs://`` fetched over HTTP by ``curl``; read-only."""
    return _command(mode, bufsize, ["curl", "-s", "-L", re.sub(r"(?i)^htgs://", "gs://", url)], None)


def gopen_gsutil(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read or write a ``gs://`` URL with ``gsutil``."""
    return _command(mode, bufsize, ["gsutil", "cat", url], ["gsutil", "cp", "-", url])


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read or write an AIStore URL with the ``ais`` command."""
    return _command(mode, bufsize, ["ais", "get", url, "-"], ["ais", "put", "-", url])


def gopen_hf(url: str, mode: str = "rb", bufsize: int = 8192) -> IO[bytes]:
    """Read an ``hf://`` URL with wdsx's Hugging Face reader (``HF_TOKEN`` as usual); read-only."""
    if mode[:1] != "r":
        raise ValueError(f"{mode}: cannot write" if mode[:1] == "w" else f"{mode}: unknown mode")
    from wdsx.sources.gopen import source_file
    from wdsx.sources.hf import open_hf

    return source_file(open_hf(url, 0, SourceOptions()), bufsize)


def gopen_error(url: str, *args: Any, **kw: Any) -> Any:
    """The table's ``__default__``: a scheme with no opener."""
    raise ValueError(f"{url}: no gopen handler defined")


def _defaults() -> dict[str, FileOpener]:
    table: dict[str, FileOpener] = {"__default__": gopen_error, "pipe": gopen_pipe}
    table.update(dict.fromkeys(("http", "https", "sftp", "ftps", "scp"), gopen_curl))
    table.update(ais=gopen_ais, gs=gopen_gsutil, htgs=gopen_htgs, hf=gopen_hf)
    for scheme in os.environ.get("USE_AIS_FOR", "").split(":"):
        if scheme:
            table[scheme] = gopen_ais
    return table


class _OpenerSource(Source):
    """A program's opener's file object as a wdsx source; an offset is reached by seeking
    when the file can, else by reading and discarding."""

    def __init__(self, url: str, stream: Any, offset: int):
        self.url = url
        self._stream = stream
        self.seekable = bool(getattr(stream, "seekable", lambda: False)())
        if offset and self.seekable:
            stream.seek(offset)
        elif offset:
            self.skip(offset)

    def read(self, n: int) -> bytes:
        return bytes(self._stream.read(n))

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class _OpenerSink(Sink):
    """A program's opener's writable file object as a wdsx sink; committing closes it."""

    def __init__(self, url: str, stream: Any):
        self.url = url
        self._stream = stream

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._stream.write(data)
        return len(data)

    def commit(self) -> None:
        self._stream.close()

    def abort(self) -> None:
        self._stream.close()


def _reader_for(table: GopenSchemes, scheme: str) -> Opener:
    def open_(url: str, offset: int, options: SourceOptions) -> Source:
        return _OpenerSource(url, table[scheme](url, "rb", 8192), offset)

    return open_


def _writer_for(table: GopenSchemes, scheme: str) -> SinkOpener:
    def open_(url: str, options: SourceOptions) -> Sink:
        return _OpenerSink(url, table[scheme](url, "wb", 8192))

    return open_


class GopenSchemes(MutableMapping[str, FileOpener]):
    """webdataset's scheme table; entries a program sets are what wdsx opens those schemes with."""

    def __init__(self) -> None:
        self._defaults = _defaults()
        self._entries = dict(self._defaults)
        self._set: set[str] = set()
        self._replaced: dict[str, Registration | None] = {}

    def __getitem__(self, scheme: str) -> FileOpener:
        return self._entries[scheme]

    def __setitem__(self, scheme: str, opener: FileOpener) -> None:
        self._entries[scheme] = opener
        if scheme == "__default__" or scheme in self._set:
            return
        self._replaced[scheme] = registered(scheme)
        register(scheme, _reader_for(self, scheme), _writer_for(self, scheme))
        self._set.add(scheme)

    def __delitem__(self, scheme: str) -> None:
        del self._entries[scheme]
        if scheme in self._set:
            self._set.discard(scheme)
            _restore(scheme, self._replaced.pop(scheme))
            if scheme in self._defaults:
                self._entries[scheme] = self._defaults[scheme]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"gopen_schemes({self._entries!r})"

    def opener_set_for(self, scheme: str) -> FileOpener | None:
        """The opener a program set for ``scheme``; None when wdsx's own reader serves it."""
        return self._entries[scheme] if scheme in self._set else None


def _restore(scheme: str, saved: Registration | None) -> None:
    """Give ``scheme`` back what wdsx's sources had for it before a program set its entry."""
    unregister(scheme)
    if saved is not None:
        register(scheme, saved.opener, saved.sink, saved.lister, bounded=saved.bounded)


gopen_schemes = GopenSchemes()
"""The table ``wdsx.gopen.gopen_schemes`` (and ``wdsx.gopen_schemes``) show."""


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> IO[bytes]:
    """webdataset's ``gopen``: a URL whose scheme has an opener set in :data:`gopen_schemes`
    is opened with it (any ``scheme:`` prefix, as webdataset parses URLs); every other URL
    with wdsx's sources (:func:`wdsx.sources.gopen.gopen`)."""
    from wdsx.sources import rewrite_url
    from wdsx.sources.gopen import gopen as open_with_sources

    if url != "-":
        scheme = urlparse(rewrite_url(url)).scheme
        if secure_mode() and scheme in ("", "file"):
            raise ValueError(
                f"gopen: unsafe_gopen is False, cannot open local files: {url} (secure mode, WDS_SECURE=1)"
            )
        opener = gopen_schemes.opener_set_for(scheme) if scheme else None
        if opener is not None:
            if mode not in ("rb", "wb"):
                raise ValueError(f"gopen: mode must be 'rb' or 'wb', got {mode!r}")
            result: IO[bytes] = opener(rewrite_url(url), mode, bufsize, **kw)
            return result
    return open_with_sources(url, mode, bufsize, **kw)


def reader(url: str, **kw: Any) -> IO[bytes]:
    """``gopen(url, "rb", ...)``."""
    return gopen(url, "rb", **kw)
