"""Small helpers for byte streams that may only have ``read``."""

from __future__ import annotations

import functools
from collections.abc import Callable


def read_into(read: Callable[[int], bytes], buffer: memoryview) -> int:
    """``readinto`` for a stream that only has ``read``: fill ``buffer`` from one read."""
    data = read(len(buffer))
    buffer[: len(data)] = data
    return len(data)


class Prefixed:
    """A reader that returns bytes already taken from a stream before the rest of it. Once
    those are used up, reads go straight to the stream (into the caller's buffer, when the
    stream can do that), so the bytes of a shard are copied only once."""

    def __init__(
        self,
        head: bytes,
        read: Callable[[int], bytes],
        readinto: Callable[[memoryview], int] | None = None,
    ):
        self.head = head
        self._read = read
        self._readinto = readinto or functools.partial(read_into, read)

    def readinto(self, buffer: memoryview) -> int:
        if not self.head:
            return self._readinto(buffer)
        count = min(len(buffer), len(self.head))
        buffer[:count] = self.head[:count]
        self.head = self.head[count:]
        return count

    def read(self, n: int = -1) -> bytes:
        if not self.head:
            return self._read(n)
        if 0 <= n < len(self.head):
            out, self.head = self.head[:n], self.head[n:]
            return out
        head, self.head = self.head, b""
        return head + self._read(n - len(head)) if n > len(head) else head
