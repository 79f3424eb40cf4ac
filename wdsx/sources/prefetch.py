"""Open the next remote shards in the background while the current one is being read.

A remote shard's first bytes arrive only after a connection, a request and the server's first
response, which for small shards can cost as much as reading them. The reader tells a
:class:`Prefetcher` which shards come next; each is opened in a background thread that
buffers at most ``4 * options.chunk`` bytes of it, so memory stays bounded however slow the
consumer is. Local files are always opened directly.
"""

from __future__ import annotations

import threading

from wdsx.core.redact import redact
from wdsx.sources import open_source, scheme_of
from wdsx.sources.base import Source, SourceOptions

_BUFFERED_CHUNKS = 4


class _Prefetched(Source):
    """A shard whose first bytes were read ahead; the rest streams from the open source.

    When reading ahead failed after some bytes had arrived (a stream that ran past its recorded
    size, a connection that dropped for good), those bytes are still delivered: ``error`` is
    raised only once they are used up, as reading the shard directly would have done.
    """

    def __init__(self, source: Source, chunks: list[bytes], error: BaseException | None = None):
        self.url = source.url
        self.local_path = source.local_path
        self.seekable = source.seekable
        self._source = source
        self._chunks = chunks
        self._error = error

    def read(self, n: int) -> bytes:
        if not self._chunks:
            if self._error is not None:
                raise self._error
            return self._source.read(n)
        head = self._chunks[0]
        if len(head) <= n:
            return self._chunks.pop(0)
        self._chunks[0] = head[n:]
        return head[:n]

    def close(self) -> None:
        self._chunks = []
        self._source.close()


class _Opening:
    """One shard being opened, and its first chunks read, by a background thread."""

    def __init__(self, url: str, offset: int, options: SourceOptions, sha256: str | None, size: int | None):
        self._url = url
        self._offset = offset
        self._options = options
        self._sha256 = sha256
        self._size = size
        self._source: Source | None = None
        self._chunks: list[bytes] = []
        self._error: BaseException | None = None
        self._cancelled = False
        self._finished = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"wdsx-prefetch {redact(url)}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        source = None
        try:
            source = self._source = open_source(
                self._url, self._offset, self._options, sha256=self._sha256, size=self._size
            )
            buffered = 0
            while buffered < _BUFFERED_CHUNKS * self._options.chunk and not self._cancelled:
                data = source.read(self._options.chunk)
                if not data:
                    break
                self._chunks.append(data)
                buffered += len(data)
        except BaseException as exn:
            self._error = exn
        with self._lock:
            self._finished = True
            if self._cancelled and source is not None:
                source.close()

    def result(self) -> Source:
        """The opened shard with its buffered head. What opening or reading raised is raised
        here when no byte arrived before it, else by the stream once the buffered bytes are read."""
        self._thread.join()
        if self._error is not None and self._source is not None:
            self._source.close()
        if self._error is not None and not self._chunks:
            raise self._error
        assert self._source is not None
        return _Prefetched(self._source, self._chunks, self._error)

    def cancel(self) -> None:
        """Stop buffering and close the shard, now or as soon as the thread is done with it."""
        with self._lock:
            self._cancelled = True
            finished, source = self._finished, self._source
        if source is not None:
            # done with it: close it here; else the thread closes it once its read returns
            source.close() if finished else source.interrupt()
        self._thread.join(timeout=self._options.timeout)


class Prefetcher:
    """Opens upcoming remote shards ahead of time; :meth:`open` hands them over when needed.

    At most ``options.prefetch`` shards are scheduled at once (0 turns prefetching off).
    """

    def __init__(self, options: SourceOptions | None = None):
        self.options = options or SourceOptions()
        self._pending: dict[tuple[str, int], _Opening] = {}
        self._closed = False

    def schedule(self, url: str, offset: int = 0, sha256: str | None = None, size: int | None = None) -> None:
        """Start opening ``url`` at ``offset`` in the background, if it is remote and there is room
        (``sha256``: the expected hash, checked by the cache; ``size``: the recorded size, see
        :func:`~wdsx.sources.open_source`)."""
        key = (url, offset)
        if (
            self._closed
            or scheme_of(url) == "file"
            or key in self._pending
            or len(self._pending) >= self.options.prefetch
        ):
            return
        self._pending[key] = _Opening(url, offset, self.options, sha256, size)

    def open(self, url: str, offset: int = 0, sha256: str | None = None, size: int | None = None) -> Source:
        """The prefetched stream for ``(url, offset)`` if it was scheduled, else a freshly opened one."""
        opening = self._pending.pop((url, offset), None)
        if opening is None:
            return open_source(url, offset, self.options, sha256=sha256, size=size)
        return opening.result()

    def close(self) -> None:
        """Cancel everything scheduled and not yet opened, closing its connections."""
        self._closed = True
        pending, self._pending = self._pending, {}
        for opening in pending.values():
            opening.cancel()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
