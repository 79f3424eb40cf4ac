"""Compressed shards: gzip, bzip2 and xz tar streams are recognised by their magic bytes.

A compressed stream cannot start at a byte offset of the tar inside it, so readers that need
an offset in one re-read it from the start (see :mod:`wdsx.stages.reading`).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable
from typing import Any

from wdsx.core.streams import Prefixed

COMPRESSED_SUFFIXES = (".gz", ".tgz", ".bz2", ".tbz", ".tbz2", ".xz", ".txz")
SHARD_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tgz", ".tbz", ".tbz2", ".txz", ".tar")
"""Names of shard files, longest first (so that stripping one leaves the stem)."""
_OPENERS: dict[bytes, Callable] = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": lambda raw: bz2.BZ2File(raw, mode="rb"),
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw, mode="rb"),
}
_SNIFF = max(len(magic) for magic in _OPENERS)


def named_compressed(url: str) -> bool:
    """Whether the name says the shard is compressed (so it cannot be opened at an offset)."""
    return url.endswith(COMPRESSED_SUFFIXES)


def uncompressed(
    read: Callable[[int], bytes], readinto: Callable[[memoryview], int] | None = None
) -> tuple[Any, bool]:
    """The tar byte stream (an object with ``read`` and ``readinto``) of a stream that may be
    compressed, and whether it was. ``readinto``, when the stream has one, reads an
    uncompressed stream without an intermediate copy."""
    head = b""
    while len(head) < _SNIFF:
        part = read(_SNIFF - len(head))
        if not part:
            break
        head += part
    raw = Prefixed(head, read, readinto)
    for magic, opener in _OPENERS.items():
        if head.startswith(magic):
            return opener(raw), True
    return raw, False
