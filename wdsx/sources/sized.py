"""A shard whose size is known beforehand (a manifest records it) ends there.

A stream without a length of its own (a chunked or connection-delimited HTTP reply, a pipe, an
fsspec file) could otherwise go on forever, and a reader that checks what follows a format's
end (tar's zero padding) would read all of it. :class:`SizedSource` asks for at most one byte
past the recorded size, and a byte there is an error naming the URL and the size.
"""

from __future__ import annotations

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source


class SizedSource(Source):
    """``inner``, opened at ``offset``, allowed to deliver bytes up to ``size`` and no further."""

    def __init__(self, inner: Source, offset: int, size: int):
        self.url = inner.url
        self.local_path = inner.local_path
        self.seekable = inner.seekable
        self._inner = inner
        self._position = offset
        self._size = size
        self._past_end = False

    def read(self, n: int) -> bytes:
        if n <= 0:
            return b""
        left = max(0, self._size - self._position)
        data = b"" if self._past_end else self._inner.read(min(n, left + 1))
        if self._past_end or len(data) > left:
            self._past_end = True
            if not left:
                raise SourceError(
                    self.url, f"the stream goes on past byte {self._size}, the shard's recorded size"
                )
            data = data[:left]  # the bytes up to the size first; the next read raises
        self._position += len(data)
        return data

    def close(self) -> None:
        self._inner.close()
