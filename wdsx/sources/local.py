"""Local files: reads seek straight to the offset; writes go to a temporary name and are
renamed into place when complete."""

from __future__ import annotations

import os
import tempfile

from wdsx.core.errors import MissingShardError, SourceError
from wdsx.sources.base import Sink, Source


def local_path(url: str) -> str | None:
    """The filesystem path a URL names, or None when it is not a local file URL.

    A ``name:`` prefix without ``//`` is a store's scheme when a reader is registered under that
    name (``mine:/data/x.tar``, see :func:`wdsx.sources.scheme_of`), and such a URL names no
    local file. Only names with a colon pay for that look-up.
    """
    if url.startswith("file://"):
        return url[len("file://") :]
    if url.startswith("file:"):
        return url[len("file:") :]
    if "://" in url or url.startswith("pipe:"):
        return None
    if ":" in url:
        from wdsx.sources import scheme_of  # here: wdsx.sources imports this module

        if scheme_of(url) != "file":
            return None
    return url


class LocalSource(Source):
    """A local file opened unbuffered (reads are already large) at a byte offset."""

    def __init__(self, url: str, path: str, offset: int = 0):
        self.url = url
        self.local_path = path
        try:
            self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()
        except IsADirectoryError as exn:
            where = url.rstrip("/")
            raise SourceError(
                url, f"is a directory, not a shard: name its shards {where}/ or {where}/*.tar"
            ) from exn
        except FileNotFoundError as exn:
            raise MissingShardError(url, f"cannot open: {exn.strerror or exn}") from exn
        except OSError as exn:
            raise SourceError(url, f"cannot open: {exn.strerror or exn}") from exn
        if offset:
            self._file.seek(offset)
        # The file's own methods, bound per instance: no Python frame between the reader and the OS.
        self.read = self._file.read  # type: ignore[method-assign,assignment]
        self.readinto = self._file.readinto  # type: ignore[method-assign,assignment]

    def skip(self, n: int) -> None:
        self._file.seek(n, os.SEEK_CUR)

    def fileno(self) -> int:
        """The open file's descriptor (to map the file without opening it again)."""
        return self._file.fileno()

    def close(self) -> None:
        self._file.close()


class LocalSink(Sink):
    """Writes to a hidden temporary file beside the target and renames it on commit."""

    def __init__(self, url: str, path: str):
        self.url = url
        self.path = path
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, self._temp = tempfile.mkstemp(
            prefix="." + os.path.basename(path) + ".", suffix=".partial", dir=directory
        )
        self._file = os.fdopen(fd, "wb")
        self.write = self._file.write  # type: ignore[method-assign,assignment]

    def commit(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.chmod(self._temp, 0o644)
            os.replace(self._temp, self.path)
        except OSError as exn:
            self.abort()  # no temporary file left behind
            raise SourceError(self.url, f"cannot write the file there: {exn.strerror or exn}") from exn

    def abort(self) -> None:
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:  # its buffer could not be written (a full disk): it is discarded anyway
                pass
        if os.path.exists(self._temp):
            os.unlink(self._temp)
