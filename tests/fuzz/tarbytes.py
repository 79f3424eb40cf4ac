"""Tar archives as raw bytes, written from the POSIX ustar layout (not by wdsx), so that
inputs can carry headers no well-behaved writer would produce."""

from __future__ import annotations

BLOCK = 512
NAME, SIZE, CHECKSUM, TYPE, MAGIC, PREFIX = (
    (0, 100),
    (124, 136),
    (148, 156),
    (156, 157),
    (257, 265),
    (345, 500),
)
ZERO = bytes(BLOCK)


def octal(value: int, width: int) -> bytes:
    """``value`` as a NUL-terminated octal field of ``width`` bytes."""
    return b"%0*o\0" % (width - 1, value)


def checksum(block: bytes | bytearray) -> int:
    """The unsigned byte sum of a header with its checksum field read as spaces."""
    return sum(block[: CHECKSUM[0]]) + 8 * 0x20 + sum(block[CHECKSUM[1] : BLOCK])


def fix_checksum(data: bytearray, at: int) -> None:
    """Rewrite the checksum field of the header at ``at`` to match its bytes."""
    data[at + CHECKSUM[0] : at + CHECKSUM[1]] = b"%06o\0 " % checksum(data[at : at + BLOCK])


def has_valid_checksum(block: bytes | bytearray) -> bool:
    """Whether a 512-byte block is a header whose checksum field holds its unsigned sum."""
    if len(block) != BLOCK or not any(block):
        return False
    field = bytes(block[CHECKSUM[0] : CHECKSUM[1]]).split(b"\0")[0].strip()
    try:
        return int(field, 8) == checksum(block)
    except ValueError:
        return False


def header(name: bytes, size: int, kind: bytes = b"0", prefix: bytes = b"") -> bytes:
    """A ustar header for a member of ``size`` bytes."""
    block = bytearray(BLOCK)
    block[0 : len(name[:100])] = name[:100]
    block[100:108] = octal(0o644, 8)
    block[108:116] = octal(0, 8)
    block[116:124] = octal(0, 8)
    block[SIZE[0] : SIZE[1]] = octal(size, 12)
    block[136:148] = octal(0, 12)
    block[TYPE[0]] = kind[0]
    block[MAGIC[0] : MAGIC[1]] = b"ustar\x0000"
    block[PREFIX[0] : PREFIX[0] + len(prefix[:155])] = prefix[:155]
    fix_checksum(block, 0)
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes, data: bytes, kind: bytes = b"0") -> bytes:
    """A header and its padded data."""
    return header(name, len(data), kind) + padded(data)


def pax_record(key: bytes, value: bytes) -> bytes:
    """One ``"<len> key=value\\n"`` pax record, its length counting itself."""
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(b"%d" % length) + len(body) != length:
        length += 1
    return b"%d" % length + body


def extended(kind: bytes, data: bytes, name: bytes = b"././@PaxHeader") -> bytes:
    """A pax (``x``/``g``) or GNU long-name (``L``) header with its data."""
    return member(name, data, kind)


def header_offsets(tar: bytes | bytearray) -> list[int]:
    """Offsets of the 512-aligned blocks that are headers with a valid checksum."""
    return [at for at in range(0, len(tar) - BLOCK + 1, BLOCK) if has_valid_checksum(tar[at : at + BLOCK])]
