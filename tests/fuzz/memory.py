"""``fuzzmem://`` shards: bytes held in this process, read a few bytes at a time, as a pipe or
an HTTP body is (the reader knows no size and gets short reads).

``fuzzmem://<name>/<step>/<file name>``: the bytes stored under ``name``, at most ``step``
bytes per read (0: as many as asked); the file name gives the shard's format by its suffix.
"""

from __future__ import annotations

from wdsx.sources import Source, SourceOptions, register

MEMORY: dict[str, bytes] = {}
"""The bytes behind ``fuzzmem://`` URLs."""


def url_of(data: bytes, file_name: str, step: int | None) -> str:
    """A ``fuzzmem://`` URL for ``data`` (which replaces what was held before)."""
    MEMORY.clear()
    MEMORY["m"] = data
    return f"fuzzmem://m/{step or 0}/{file_name}"


class _MemorySource(Source):
    def __init__(self, url: str, offset: int):
        self.url = url
        self.local_path = None
        name, step, _ = url[len("fuzzmem://") :].split("/", 2)
        self._data = memoryview(MEMORY[name])
        self._position = offset
        self._step = int(step) or None

    def read(self, n: int) -> bytes:
        if self._step is not None:
            n = min(n, self._step)
        part = bytes(self._data[self._position : self._position + n])
        self._position += len(part)
        return part


def _open(url: str, offset: int, options: SourceOptions) -> Source:
    return _MemorySource(url, offset)


register("fuzzmem", _open)
