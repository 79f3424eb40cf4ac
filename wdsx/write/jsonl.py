"""Write JSONL shards: one JSON value per line, atomically, with a manifest.

:class:`JsonlWriter` writes one shard the way :class:`~wdsx.write.writer.TarWriter` writes a tar
(through the same buffered, compressing, hashing output: the file appears under its name
only when complete, and the same values give the same bytes); :class:`JsonlShardWriter` is
:class:`~wdsx.write.writer.ShardWriter` over it: shards cut by ``maxcount``/``maxsize``, and a
manifest with each shard's line count, size and SHA-256.

Compression follows the name (``.jsonl.gz``: gzip without a timestamp, ``.jsonl.zst``: zstd,
which needs ``pip install 'wdsx[zstd]'``) unless ``compress`` says otherwise.
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from wdsx.sources import SourceOptions
from wdsx.write.writer import ShardWriter, _FileWriter, compression_for


def _zstd_compressor() -> Any:
    try:
        import zstandard
    except ImportError as exn:
        raise ImportError("writing .zst shards needs zstandard: pip install 'wdsx[zstd]'") from exn
    return zstandard.ZstdCompressor().compressobj()


class JsonlWriter(_FileWriter):
    """Write JSON values, one per line, to one JSONL shard.

    ``fileobj`` is a URL or path (the shard appears only when :meth:`close` completes) or a
    writable binary stream (left open). ``compress``: None (from the name), False, True (gzip),
    ``"gz"``, ``"bz2"``, ``"xz"`` or ``"zst"``.
    """

    def __init__(
        self,
        fileobj: str | BinaryIO,
        compress: bool | str | None = None,
        options: SourceOptions | None = None,
    ):
        zstd = compress == "zst" or (
            compress is None and isinstance(fileobj, str) and fileobj.endswith(".zst")
        )
        self._zstd = _zstd_compressor() if zstd else None
        self._open(fileobj, None if zstd else compression_for(fileobj, compress), options)
        self.count = 0
        """Lines written."""

    def write(self, value: Any) -> int:
        """Write ``value`` (anything ``json.dumps`` takes) as one line; returns the line's bytes."""
        if self.closed:
            raise ValueError("write to a closed JsonlWriter")
        line = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        self._out.add(self._zstd.compress(line) if self._zstd is not None else line)
        self.count += 1
        return len(line)

    def _trailer(self) -> bytes:
        return self._zstd.flush() if self._zstd is not None else b""


class JsonlShardWriter(ShardWriter):
    """:class:`~wdsx.write.writer.ShardWriter` for JSONL shards: ``pattern % n`` names each
    shard (``out/part-%05d.jsonl.gz``), ``write(value)`` writes one line, and ``close()``
    writes the manifest (``out/part.manifest.json``). ``maxsize`` counts line bytes."""

    writer_type = JsonlWriter
