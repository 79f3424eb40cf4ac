"""webdataset's ``gopen(url, mode)``: a file object for any URL wdsx can read or write."""

from __future__ import annotations

import io
import sys
from typing import IO, TYPE_CHECKING

from wdsx.sources import open_sink, open_source
from wdsx.sources.base import Sink, Source, SourceOptions

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer


class _SourceFile(io.RawIOBase):
    """A read-only raw file over a :class:`Source`."""

    def __init__(self, source: Source):
        self.source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = self.source.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self.source.close()
        super().close()


class _SinkFile(io.RawIOBase):
    """A write-only raw file over a :class:`Sink`; closing commits, so the target appears
    only once the writer is done."""

    def __init__(self, sink: Sink):
        self.sink = sink

    def writable(self) -> bool:
        return True

    def write(self, data: ReadableBuffer) -> int:
        chunk = bytes(data)
        self.sink.write(chunk)
        return len(chunk)

    def close(self) -> None:
        if not self.closed:
            self.sink.commit()
        super().close()


def source_file(source: Source, bufsize: int = 8192) -> IO[bytes]:
    """A buffered, read-only binary file over ``source``; closing it closes the source. This is
    how an opener that returns a :class:`Source` becomes one that returns a file object."""
    return io.BufferedReader(_SourceFile(source), max(bufsize, io.DEFAULT_BUFFER_SIZE))


def gopen(
    url: str, mode: str = "rb", bufsize: int = 8192, options: SourceOptions | None = None, **_: object
) -> IO[bytes]:
    """Open ``url`` for reading (``"rb"``) or writing (``"wb"``); ``"-"`` is stdin/stdout."""
    if mode not in ("rb", "wb"):
        raise ValueError(f"gopen: mode must be 'rb' or 'wb', got {mode!r}")
    if url == "-":
        return sys.stdin.buffer if mode == "rb" else sys.stdout.buffer
    if mode == "rb":
        return source_file(open_source(url, 0, options), bufsize)
    return io.BufferedWriter(_SinkFile(open_sink(url, options)), max(bufsize, io.DEFAULT_BUFFER_SIZE))
