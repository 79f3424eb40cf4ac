"""Every other URL whose protocol fsspec knows (``memory://``, ``sftp://``, ``webhdfs://``...).

Read through fsspec's file objects: a shard opens at an offset by seeking, reads go straight to
the filesystem in ``options.chunk`` pieces (no read-ahead cache, so a failed read loses at most
one piece), and a failed read reopens the file at the first byte not yet delivered. Keyword
arguments for a protocol's filesystem come from ``SourceOptions.fsspec[protocol]``, credentials
from that filesystem's own chain. Missing files and denied access are errors at once; other
``OSError``\\ s (connection resets, timeouts) are retried.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
import fsspec.core

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.retry import Response, ResumingSource, TransientError

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def knows_protocol(scheme: str) -> bool:
    """Whether fsspec has a filesystem for ``scheme`` (its package may still be missing: opening
    a URL then says which)."""
    try:
        fsspec.get_filesystem_class(scheme)
    except ValueError:
        return False
    except ImportError:
        return True
    return True


def _filesystem(url: str, options: SourceOptions) -> tuple[Any, str]:
    """The filesystem for ``url``'s protocol and the path within it."""
    protocol = url.partition("://")[0]
    try:
        return fsspec.core.url_to_fs(url, **options.fsspec.get(protocol, {}))
    except ImportError as exn:
        raise SourceError(url, f"the {protocol}:// filesystem needs a package: {exn}") from exn
    except (TypeError, ValueError) as exn:
        raise SourceError(url, f"cannot make the {protocol}:// filesystem: {exn}") from exn


def _code(exn: OSError) -> str:
    """``ENOENT``-style name of the error, else its type."""
    return errno.errorcode.get(exn.errno or 0) or type(exn).__name__


@contextmanager
def fsspec_errors(url: str, doing: str) -> Iterator[None]:
    """Missing files and denied access raise :class:`SourceError`; other OS errors are transient."""
    try:
        yield
    except _PERMANENT as exn:
        raise SourceError(url, f"{doing}: {_code(exn)}: {exn}") from exn
    except SourceError:
        raise
    except OSError as exn:
        raise TransientError(f"{doing}: {_code(exn)}: {exn}") from exn


class _FileBody:
    """An fsspec file whose failures surface as :class:`TransientError` or :class:`SourceError`."""

    def __init__(self, url: str, handle: Any):
        self._url = url
        self._handle = handle

    def read(self, n: int) -> bytes:
        with fsspec_errors(self._url, "reading"):
            return bytes(self._handle.read(n))

    def close(self) -> None:
        self._handle.close()


def open_fsspec(url: str, offset: int, options: SourceOptions, *, end: int | None = None) -> Source:
    """Read ``url`` through fsspec from ``offset`` (a seek), up to ``end`` when given (the
    source stops there; fsspec fetches in its own blocks)."""
    fs, path = _filesystem(url, options)

    def connect(start: int, _stop: int | None) -> Response:
        with fsspec_errors(url, f"opening at byte {start}"):
            info = fs.info(path)
            if info.get("type") == "directory":
                raise SourceError(url, "is a directory, not a shard")
            size = info.get("size")
            if size is not None and start > size:
                raise SourceError(url, f"offset {start} is past the end of the file ({size} bytes)")
            handle = fs.open(path, "rb", block_size=options.chunk, cache_type="none")
            try:
                handle.seek(start)
            except BaseException:
                handle.close()
                raise
            return Response(_FileBody(url, handle), start, size, fs.ukey(path))

    return ResumingSource(url, offset, options, connect, end)


def list_fsspec(prefix: str, options: SourceOptions) -> list[str]:
    """Every file URL starting with ``prefix``, spelled as ``prefix`` spells its directory."""
    directory = prefix[: prefix.rfind("/") + 1]
    fs, root = _filesystem(directory, options)
    with fsspec_errors(prefix, "listing"):
        if not fs.exists(root):
            return []
        found = fs.find(root)
    root = root.rstrip("/")
    return [directory + path[len(root) :].lstrip("/") for path in found if path.startswith(root)]
