"""Mutations of a valid shard, each a pure function of a seeded random generator: what a
damaged disk, a broken transfer, a buggy writer or an attacker can do to a tar.

Tar-level mutations act on the uncompressed tar (which is then compressed again for a
compressed shard); stream-level ones act on the stored bytes (for a compressed shard: damage
to the gzip, bzip2 or xz stream itself).
"""

from __future__ import annotations

import random
import tarfile
from collections.abc import Callable

from tests.fuzz import tarbytes
from tests.fuzz.tarbytes import BLOCK, CHECKSUM, NAME, PREFIX, SIZE, TYPE

Mutation = Callable[[random.Random, bytearray], bytearray]

INTERESTING_SIZES: list[bytes] = [
    b"-0000001000\0",  # negative, octal
    b"\xff" * 11 + b"\x00",  # negative, GNU base-256
    b"\xff" * 12,
    b"%011o\0" % 1_500_000_000,
    b"%012o" % (8 << 30),  # 8 GiB: all twelve digits, no terminator
    b"\x80" + (1 << 80).to_bytes(11, "big"),  # base-256 2^80
    b"\x80" + bytes(10) + b"\x01",
    b"0000000008 \0",  # not octal
    b"   \0        ",
    bytes(12),
    b"77777777777\0",
    b"0_1\0        ",
    b"+0000000001\0",
]
TYPES = b"0\x001234567xgLKSXVMDN" + bytes([0xFF, 0x80, 0x41])
PAX_KEYS = [b"path", b"size", b"GNU.sparse.major", b"hdrcharset", b"linkpath", b"mtime", b"", b"=x"]
PAX_VALUES = [
    b"100000000000000",
    b"-5",
    b"12x",
    b"",
    b"0",
    b"a/b.txt",
    b"k.txt/",
    b"\xff\xfe",
    b"1e3",
    b"99999",
]


def _header(rng: random.Random, data: bytearray) -> int | None:
    headers = tarbytes.header_offsets(data)
    return rng.choice(headers) if headers else None


def _aligned(rng: random.Random, data: bytearray) -> int:
    return rng.randrange(0, len(data) // BLOCK + 1) * BLOCK


def _size_of(data: bytearray, at: int) -> int:
    """The size field of the header at ``at`` as tar reads it, or 0 when it is not a number."""
    try:
        return max(0, tarfile.nti(bytes(data[at + SIZE[0] : at + SIZE[1]])))
    except (ValueError, tarfile.HeaderError):
        return 0


def _maybe_fix(rng: random.Random, data: bytearray, at: int) -> None:
    if rng.random() < 0.85 and at + BLOCK <= len(data):
        tarbytes.fix_checksum(data, at)


def bit_flips(rng: random.Random, data: bytearray) -> bytearray:
    for _ in range(rng.randint(1, 4)):
        if data:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return data


def byte_values(rng: random.Random, data: bytearray) -> bytearray:
    if data:
        data[rng.randrange(len(data))] = rng.choice([0, 0xFF, 0x80, 0x7F, 0x30, 0x37, 0x20, 0x2D, 0x2E, 0x2F])
    return data


def size_field(rng: random.Random, data: bytearray) -> bytearray:
    at = _header(rng, data)
    if at is not None:
        if rng.random() < 0.5:
            value = rng.choice(INTERESTING_SIZES)
        else:
            change = rng.choice([-513, -512, -1, 1, 511, 512, 4096])
            value = tarbytes.octal(min(8**11 - 1, max(0, _size_of(data, at) + change)), 12)
        data[at + SIZE[0] : at + SIZE[1]] = value
        _maybe_fix(rng, data, at)
    return data


def checksum_field(rng: random.Random, data: bytearray) -> bytearray:
    at = _header(rng, data)
    if at is not None:
        stored = tarbytes.checksum(data[at : at + BLOCK]) + rng.choice([-1, 1, 256, -256])
        data[at + CHECKSUM[0] : at + CHECKSUM[1]] = rng.choice(
            [b"%06o\0 " % max(0, stored), b"\0" * 8, b"        ", b"-0000001", b"%07o\0" % max(0, stored)]
        )
    return data


def type_field(rng: random.Random, data: bytearray) -> bytearray:
    at = _header(rng, data)
    if at is not None:
        data[at + TYPE[0]] = rng.choice(TYPES)
        _maybe_fix(rng, data, at)
    return data


def name_field(rng: random.Random, data: bytearray) -> bytearray:
    at = _header(rng, data)
    if at is not None:
        start, end = rng.choice([NAME, PREFIX])
        choice = rng.random()
        if choice < 0.3:
            value = rng.randbytes(rng.randint(1, end - start))
        elif choice < 0.5:
            value = rng.choice(
                [b"a/", b"x.txt/", b"__meta__", b"__x__/y.txt", b".hidden.txt", b"noext", b"a.b.c"]
            )
        elif choice < 0.7:
            value = b"n" * (end - start)  # no terminating NUL
        else:
            value = bytes(data[at + start : at + end]).replace(b".", b"_", 1)
        value = value[: end - start]
        data[at + start : at + end] = value + bytes(end - start - len(value))
        _maybe_fix(rng, data, at)
    return data


def pax_header(rng: random.Random, data: bytearray) -> bytearray:
    """Insert a pax header with odd records before a header, or a malformed one."""
    at = _header(rng, data) or 0
    records = b"".join(
        tarbytes.pax_record(rng.choice(PAX_KEYS), rng.choice(PAX_VALUES)) for _ in range(rng.randint(1, 3))
    )
    if rng.random() < 0.3:  # break the framing
        records = bytearray(records)
        records[rng.randrange(len(records))] = rng.choice(b"0123456789 =\n\0x")
        records = bytes(records)
    kind = rng.choice([b"x", b"x", b"x", b"g", b"X"])
    data[at:at] = tarbytes.extended(kind, records)
    return data


def long_name(rng: random.Random, data: bytearray) -> bytearray:
    """Insert a GNU long-name header before a header, with or without its NUL, of any size."""
    at = _header(rng, data) or 0
    name = rng.choice([b"long/" * 30 + b"k.txt", b"x.txt", b"", b"a/b/"]) + rng.choice([b"\0", b""])
    block = bytearray(tarbytes.extended(b"L", name, b"././@LongLink"))
    if rng.random() < 0.3:
        block[SIZE[0] : SIZE[1]] = rng.choice(INTERESTING_SIZES)
        tarbytes.fix_checksum(block, 0)
    data[at:at] = block
    return data


def zero_block_replace(rng: random.Random, data: bytearray) -> bytearray:
    at = rng.choice(tarbytes.header_offsets(data) or [0]) if rng.random() < 0.7 else _aligned(rng, data)
    data[at : at + BLOCK] = bytes(min(BLOCK, max(0, len(data) - at)))
    return data


def zero_block_insert(rng: random.Random, data: bytearray) -> bytearray:
    at = rng.choice(tarbytes.header_offsets(data) or [0]) if rng.random() < 0.7 else _aligned(rng, data)
    data[at:at] = tarbytes.ZERO
    return data


def zero_after_extended(rng: random.Random, data: bytearray) -> bytearray:
    """A zero block right after an extended header's data, where its member should be."""
    extended = [at for at in tarbytes.header_offsets(data) if data[at + TYPE[0]] in b"xLgK"]
    if not extended:
        return zero_block_insert(rng, data)
    at = rng.choice(extended)
    after = at + BLOCK + -(-_size_of(data, at) // BLOCK) * BLOCK
    data[after:after] = tarbytes.ZERO
    return data


def leading_zero(rng: random.Random, data: bytearray) -> bytearray:
    data[0:0] = tarbytes.ZERO * rng.randint(1, 2)
    return data


def block_insert(rng: random.Random, data: bytearray) -> bytearray:
    at = _aligned(rng, data)
    blocks = len(data) // BLOCK
    if blocks and rng.random() < 0.5:
        source = rng.randrange(blocks) * BLOCK
        block = bytes(data[source : source + BLOCK])
    else:
        block = rng.randbytes(BLOCK)
    data[at:at] = block
    return data


def block_delete(rng: random.Random, data: bytearray) -> bytearray:
    at = _aligned(rng, data)
    del data[at : at + BLOCK * rng.randint(1, 2)]
    return data


def block_duplicate(rng: random.Random, data: bytearray) -> bytearray:
    at = _aligned(rng, data)
    data[at:at] = data[at : at + BLOCK]
    return data


def truncate(rng: random.Random, data: bytearray) -> bytearray:
    del data[rng.randint(0, len(data)) :]
    return data


def append(rng: random.Random, data: bytearray) -> bytearray:
    data += rng.choice(
        [rng.randbytes(rng.randint(1, 700)), bytes(rng.randint(1, 2000)), tarbytes.ZERO + b"x"]
    )
    return data


TAR_MUTATIONS: dict[str, Mutation] = {
    "bit_flips": bit_flips,
    "byte_values": byte_values,
    "size_field": size_field,
    "checksum_field": checksum_field,
    "type_field": type_field,
    "name_field": name_field,
    "pax_header": pax_header,
    "long_name": long_name,
    "zero_block_replace": zero_block_replace,
    "zero_block_insert": zero_block_insert,
    "zero_after_extended": zero_after_extended,
    "leading_zero": leading_zero,
    "block_insert": block_insert,
    "block_delete": block_delete,
    "block_duplicate": block_duplicate,
    "truncate": truncate,
    "append": append,
}


def stream_trailer(rng: random.Random, data: bytearray) -> bytearray:
    """Damage the last bytes of a compressed stream (gzip's CRC and length)."""
    if data:
        data[-rng.randint(1, min(8, len(data)))] ^= 1 << rng.randrange(8)
    return data


def stream_header(rng: random.Random, data: bytearray) -> bytearray:
    """Damage the first bytes of a compressed stream (magic, method, flags)."""
    if data:
        data[rng.randrange(min(10, len(data)))] ^= 1 << rng.randrange(8)
    return data


def stream_concat(rng: random.Random, data: bytearray) -> bytearray:
    """Append a copy of the stream (a second gzip member) or part of one."""
    data += data[: rng.choice([len(data), rng.randint(0, len(data))])]
    return data


STREAM_MUTATIONS: dict[str, Mutation] = {
    "stream_bit_flips": bit_flips,
    "stream_truncate": truncate,
    "stream_trailer": stream_trailer,
    "stream_header": stream_header,
    "stream_concat": stream_concat,
    "stream_append": append,
}


def choose(rng: random.Random, stream: bool) -> list[tuple[str, Mutation]]:
    """One to three mutations of the tar, or (``stream``) of the compressed stream."""
    table = STREAM_MUTATIONS if stream else TAR_MUTATIONS
    names = rng.choices(sorted(table), k=rng.choice([1, 1, 1, 2, 3]))
    return [(name, table[name]) for name in names]
