"""Compressed shards: gzip, bzip2 and xz tar streams are recognised by their magic bytes and
decompressed as they are read.

A compressed stream cannot start at a byte offset of the tar inside it, so readers that need
an offset in one re-read it from the start (see :mod:`wdsx.read.shard`).

Decompression is done here rather than by ``gzip.GzipFile`` and friends for two reasons:

- damage must not cost what came before it. ``GzipFile.read(n)`` decompresses up to ``n``
  bytes and, when it meets damage on the way, raises and drops everything it had decoded in
  that call. :class:`Decompressed` hands out every byte decoded before the damage (for gzip
  exactly: the failing input is replayed byte by byte from a copy of the decoder's state), and
  raises on the next read;
- errors must say where: a :class:`DecompressionError` names the format and the offset in the
  compressed bytes, where the raw ``EOFError``, ``zlib.error`` or ``BadGzipFile`` names nothing.

Concatenated streams (``cat a.gz b.gz``) are read as one, and zero bytes after the last one are
padding (up to :data:`MAX_PADDING`); anything else after it is an error, as with ``gzip`` itself.

Decompression is bounded (:class:`~wdsx.core.limits.Inflation`): once a stretch of output
reaches the grace size, it must have come from at least 1/ratio of that in compressed bytes,
or the stream is refused with an :class:`InflationError`. A stream of zeros compressed to a few
kilobytes is so refused after the grace size, wherever its bytes go.
"""

from __future__ import annotations

import bz2
import io
import lzma
import zlib
from collections.abc import Callable
from typing import Any

from wdsx.core.errors import WdsxError
from wdsx.core.limits import Inflation
from wdsx.core.streams import Prefixed

COMPRESSED_SUFFIXES = (".gz", ".tgz", ".bz2", ".tbz", ".tbz2", ".xz", ".txz")
SHARD_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz", ".tbz2", ".txz", ".tar")
"""Names of shard files, longest first (so that stripping one leaves the stem)."""

_MAGIC = {"gzip": b"\x1f\x8b", "bzip2": b"BZh", "xz": b"\xfd7zXZ\x00"}
_NEW_DECODER: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "bzip2": bz2.BZ2Decompressor,
    "xz": lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ),
}
_FEED = {"gzip": 1 << 16, "bzip2": 1 << 14, "xz": 1 << 14}
"""Compressed bytes given to the decoder at a time. gzip's damaged input is replayed to find
the exact spot; the others cannot copy their state, so small feeds bound what a damaged
stream can take with it."""
_SNIFF = max(len(magic) for magic in _MAGIC.values())
MAX_PADDING = 1 << 20
"""The most zero bytes accepted after the last compressed stream (a stream of endless zeros
must not keep a reader waiting)."""
_DECODER_ERRORS = (zlib.error, lzma.LZMAError, OSError, EOFError, ValueError)


class DecompressionError(WdsxError):
    """A compressed stream is damaged or truncated: says the format, the offset in the
    compressed bytes, and what the decoder said. Readers turn it into a
    :class:`~wdsx.core.errors.ShardError` that also names the shard and the tar member."""

    def __init__(self, kind: str, position: int, detail: str):
        self.kind = kind
        self.position = position
        self.detail = detail
        super().__init__(f"damaged {kind} data at compressed byte offset {position}: {detail}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.kind, self.position, self.detail))


class InflationError(DecompressionError):
    """A compressed stream inflates beyond the limits of :class:`~wdsx.core.limits.Inflation`:
    says the format, where in the compressed bytes, and which variables allow it."""

    def __init__(self, kind: str, position: int, detail: str):
        self.kind = kind
        self.position = position
        self.detail = detail
        WdsxError.__init__(self, f"{kind} data refused at compressed byte offset {position}: {detail}")


class DataAfterStreamError(DecompressionError):
    """After a whole compressed stream, whose own checks passed, come bytes that are neither
    zero padding nor another stream: what was decompressed is intact, and the rest is
    trailing data (the tar reader reports it as such)."""


def named_compressed(url: str) -> bool:
    """Whether the name says the shard is compressed (so it cannot be opened at an offset)."""
    return url.endswith(COMPRESSED_SUFFIXES)


class Decompressed:
    """The decompressed bytes of a gzip, bzip2 or xz stream read through ``read``.

    ``position`` is how many compressed bytes have been decoded so far. An error is raised
    only once every byte decoded before the damage has been returned. Output beyond the
    limits of ``inflation`` (default: the environment's) raises :class:`InflationError`.
    """

    def __init__(self, read: Callable[[int], bytes], kind: str, inflation: Inflation | None = None):
        self._read = read
        self.kind = kind
        self._decoder = _NEW_DECODER[kind]()
        self._feed = _FEED[kind]
        self._input = b""
        """Compressed bytes read but not yet decoded."""
        self._output = b""
        """Decoded bytes not yet returned (what was salvaged before an error)."""
        self._error: DecompressionError | None = None
        self._finished = False
        self._starved = True
        """Whether the decoder needs more input to produce anything (zlib's cannot say)."""
        self.position = 0
        self._inflation = Inflation.from_environment() if inflation is None else inflation
        self._stretch = 0
        """Bytes produced since :attr:`_stretch_from` (the compressed position then)."""
        self._stretch_from = 0

    def readinto(self, buffer: memoryview) -> int:
        data = self._produce(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while part := self._produce(1 << 20):
                parts.append(part)
            return b"".join(parts)
        return self._produce(n)

    def _produce(self, limit: int) -> bytes:
        """Up to ``limit`` decoded bytes; ``b""`` only at the end of the last stream."""
        while True:
            if self._output:
                out, self._output = self._output[:limit], self._output[limit:]
                return out
            if self._error is not None:
                raise self._error
            if self._finished or limit <= 0:
                return b""
            if self._decoder.eof:
                self._next_stream()
                continue
            if not self._input and self._needs_input():
                chunk = self._read(self._feed)
                if not chunk:
                    self._error = DecompressionError(
                        self.kind, self.position, "the stream ends before its end marker (truncated)"
                    )
                    continue
                self._input = chunk
            out = self._decode(limit)
            if out:
                self._stretch += len(out)
                if self._stretch >= self._inflation.grace:
                    self._check_stretch()
                return out

    def _check_stretch(self) -> None:
        """At the end of a stretch of output as long as the grace size: refuse the rest of the
        stream if the stretch came from too few compressed bytes, else start another."""
        compressed = self.position - self._stretch_from
        if self._stretch > self._inflation.ratio * compressed:
            self._error = InflationError(
                self.kind, self.position, self._inflation.refusal(self._stretch, compressed)
            )
        self._stretch, self._stretch_from = 0, self.position

    def _needs_input(self) -> bool:
        needs = getattr(self._decoder, "needs_input", None)
        return self._starved if needs is None else bool(needs)

    def _decode(self, limit: int) -> bytes:
        """Give the pending input to the decoder; on damage keep what came before it."""
        data, self._input = self._input, b""
        zlib_decoder = self.kind == "gzip"
        backup = self._decoder.copy() if zlib_decoder else None
        try:
            out = self._decoder.decompress(data, limit)
        except _DECODER_ERRORS as exn:
            salvaged, offset = self._salvage(backup, data) if backup is not None else (b"", 0)
            self._output = salvaged
            self.position += offset  # the salvaged bytes came from the input before the damage
            self._error = DecompressionError(self.kind, self.position, str(exn) or type(exn).__name__)
            return b""
        if zlib_decoder:
            tail = self._decoder.unconsumed_tail
            self._starved = len(out) < limit and not tail
            self._input = tail
            consumed = len(data) - len(tail)
            if self._decoder.eof:
                consumed -= len(self._decoder.unused_data)
            self.position += consumed
        else:
            self.position += len(data)
            if self._decoder.eof:
                self.position -= len(self._decoder.unused_data)
        return out

    def _salvage(self, decoder: Any, data: bytes) -> tuple[bytes, int]:
        """Replay ``data`` into a copy of the decoder one byte at a time: the bytes it decodes
        before failing, and the offset in ``data`` of the byte it fails on."""
        parts = []
        for index in range(len(data)):
            try:
                parts.append(decoder.decompress(data[index : index + 1]))
            except _DECODER_ERRORS:
                return b"".join(parts), index
        return b"".join(parts), len(data)

    def _next_stream(self) -> None:
        """After the end of one compressed stream: zero padding and the end of the input, or
        another stream of the same format."""
        rest = self._decoder.unused_data
        end = self.position
        while not rest.strip(b"\0"):
            self.position += len(rest)
            if self.position - end > MAX_PADDING:
                self._error = DataAfterStreamError(
                    self.kind,
                    end,
                    f"more than {MAX_PADDING} zero bytes after the end of the compressed stream",
                )
                return
            rest = self._read(self._feed)
            if not rest:
                self._finished = True
                return
        padding = len(rest) - len(rest.lstrip(b"\0"))
        self.position += padding
        rest = rest[padding:]
        magic = _MAGIC[self.kind]
        while len(rest) < len(magic):
            more = self._read(self._feed)
            if not more:
                break
            rest += more
        if not rest.startswith(magic):
            self._error = DataAfterStreamError(
                self.kind, self.position, "data after the end of the compressed stream"
            )
            return
        self._decoder = _NEW_DECODER[self.kind]()
        self._input = rest
        self._starved = True


def inflate(data: bytes, kind: str = "gzip") -> bytes:
    """The decompressed bytes of a whole compressed field (``kind``: gzip, bzip2 or xz),
    within the limits of :class:`~wdsx.core.limits.Inflation`: a field that inflates beyond
    them raises :class:`InflationError` before more than the grace size is held."""
    if not data:  # as gzip.decompress(b"")
        return b""
    stream = Decompressed(io.BytesIO(data).read, kind)
    parts = []
    while part := stream.read(1 << 20):
        parts.append(part)
    return b"".join(parts)


def uncompressed(
    read: Callable[[int], bytes], readinto: Callable[[memoryview], int] | None = None
) -> tuple[Any, bool]:
    """The tar byte stream (an object with ``read`` and ``readinto``) of a stream that may be
    compressed, and whether it was. ``readinto``, when the stream has one, reads an
    uncompressed stream without an intermediate copy. A compressed stream's damage raises
    :class:`DecompressionError`."""
    head = b""
    while len(head) < _SNIFF:
        part = read(_SNIFF - len(head))
        if not part:
            break
        head += part
    raw = Prefixed(head, read, readinto)
    for kind, magic in _MAGIC.items():
        if head.startswith(magic):
            return Decompressed(raw.read, kind), True
    return raw, False
