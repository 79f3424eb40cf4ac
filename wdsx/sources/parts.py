"""The shape every object-store writer shares: upload fixed-size parts as they fill, and make
the object appear, complete, only when the shard is committed."""

from __future__ import annotations

from wdsx.sources.base import Sink

PART_SIZE = 16 << 20
"""Bytes per uploaded part (a multiple of 256 KiB, as resumable GCS uploads require)."""


class PartedSink(Sink):
    """Buffers writes and hands them on in parts of ``part_size`` bytes.

    Subclasses say how a part is uploaded (:meth:`_upload_part`), how the rest and the
    finished object are committed (:meth:`_finish`) and how uploaded parts are discarded
    (:meth:`_discard`). A failed commit discards, so no partial object is ever visible.
    """

    def __init__(self, url: str, part_size: int = PART_SIZE):
        self.url = url
        self.part_size = part_size
        self._buffer = bytearray()
        self._finished = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._finished:
            raise ValueError(f"{self.url}: write after commit or abort")
        self._buffer += data
        while len(self._buffer) >= self.part_size:
            self._upload_part(bytes(self._buffer[: self.part_size]))
            del self._buffer[: self.part_size]
        return len(data)

    def commit(self) -> None:
        if self._finished:
            return
        try:
            self._finish(bytes(self._buffer))
        except BaseException:
            self.abort()
            raise
        self._finished = True
        self._buffer = bytearray()

    def abort(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._buffer = bytearray()
        self._discard()

    def _upload_part(self, data: bytes) -> None:
        raise NotImplementedError

    def _finish(self, rest: bytes) -> None:
        """Upload ``rest`` (the bytes after the last full part) and complete the object."""
        raise NotImplementedError

    def _discard(self) -> None:
        """Drop what was uploaded; the final name is left untouched."""
        raise NotImplementedError
