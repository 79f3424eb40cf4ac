"""Write JSONL shards: one JSON value per line, atomically, with a manifest.

:class:`JsonlWriter` writes one shard the way :class:`~wdsx.write.writer.TarWriter` writes a tar
(through the same buffered, compressing, hashing output: the file appears under its name
only when complete, and the same values give the same bytes); :class:`JsonlShardWriter` is
:class:`~wdsx.write.writer.ShardWriter` over it: shards cut by ``maxcount``/``maxsize``, and a
manifest with each shard's line count, size and SHA-256.

Compression follows the name (``.jsonl.gz``: gzip without a timestamp, ``.jsonl.zst``: zstd,
which needs the ``zstandard`` package) unless ``compress`` says otherwise.

A value that would not read back as written is refused with an
:class:`~wdsx.codecs.encode.EncodingError` naming the line, before any of it is written: one
``json.dumps`` cannot encode (a set, an object, a circular list, a lone surrogate) and one
with a dict key that is not a str (JSON would turn ``{1: "a"}`` into ``{"1": "a"}``).
"""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from wdsx.core.errors import EncodingError
from wdsx.core.extras import install_hint
from wdsx.read.formats import shard_stem
from wdsx.sources import SourceOptions
from wdsx.write.writer import ShardWriter, _FileWriter, compression_for


def _non_str_key(value: Any) -> tuple[str, Any] | None:
    """Where the first dict key that is not a str lies in ``value`` (a path such as
    ``["a"][0]``, and the key), or None. ``value`` must be free of cycles (``json.dumps``
    succeeded on it)."""
    pending: list[tuple[str, Any]] = [("", value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    return path, key
                if isinstance(inner, (dict, list, tuple)):
                    pending.append((f"{path}[{key!r}]", inner))
        elif isinstance(item, (list, tuple)):
            pending.extend(
                (f"{path}[{index}]", inner)
                for index, inner in enumerate(item)
                if isinstance(inner, (dict, list, tuple))
            )
    return None


def _zstd_compressor() -> Any:
    try:
        import zstandard
    except ImportError as exn:
        hint = install_hint("zstd", "zstandard")
        raise ImportError(f"writing .zst shards needs zstandard: {hint}") from exn
    return zstandard.ZstdCompressor().compressobj()


def compression_named(name: str) -> str | None:
    """The compression a JSONL shard named ``name`` gets when none is asked for: zstd for
    ``.zst``, else what the other writers tell from a name."""
    return "zst" if name.endswith(".zst") else compression_for(name, None)


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
        if compress is None and isinstance(fileobj, str):
            compress = compression_named(fileobj)
        zstd = compress == "zst"
        self._zstd = _zstd_compressor() if zstd else None
        self._open(fileobj, None if zstd else compression_for(fileobj, compress), options)
        self.count = 0
        """Lines written."""

    def write(self, value: Any) -> int:
        """Write ``value`` (anything ``json.dumps`` takes) as one line; returns the line's bytes."""
        if self.closed:
            raise ValueError("write to a closed JsonlWriter")
        line = self._line(value)
        self._put((self._zstd.compress(line) if self._zstd is not None else line,))
        self.count += 1
        return len(line)

    def _line(self, value: Any) -> bytes:
        """``value``'s line; an :class:`EncodingError` when it would not read back as written."""
        try:
            line = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
        except (TypeError, ValueError, RecursionError) as exn:
            raise self._refused(f"json.dumps cannot write it ({type(exn).__name__}: {exn})") from exn
        found = _non_str_key(value)
        if found is not None:
            path, key = found
            as_read = next(iter(json.loads(json.dumps({key: None}))))
            raise self._refused(
                f"the object at value{path} has a {type(key).__name__} key {key!r}, which JSON "
                f"would turn into the string {as_read!r}"
            )
        return line

    def _refused(self, reason: str) -> EncodingError:
        """The error for the line being written, named by the key the reader will give it."""
        key = f"{shard_stem(self.url)}/{self.count}" if self.url is not None else None
        return EncodingError(f"line {self.count + 1}: {reason}", key, url=self.url)

    def _trailer(self) -> bytes:
        return self._zstd.flush() if self._zstd is not None else b""


class JsonlShardWriter(ShardWriter):
    """:class:`~wdsx.write.writer.ShardWriter` for JSONL shards: ``pattern % n`` names each
    shard (``out/part-%05d.jsonl.gz``), ``write(value)`` writes one line, and ``close()``
    writes the manifest (``out/part.manifest.json``). ``maxsize`` counts line bytes."""

    writer_type = JsonlWriter
    compression_named = staticmethod(compression_named)
