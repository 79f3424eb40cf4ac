"""Tar headers for the writer: ustar, plus a pax extended header only where ustar cannot say it.

A writer's members differ only in name and size, so :class:`HeaderMaker` prepares the fixed
fields (mode, owner, mtime) once and each header costs a few concatenations and a checksum over
the changing bytes. Names up to 100 bytes, or up to 256 when they split at a ``/`` into ustar's
prefix and name fields, stay plain ustar; longer or non-ASCII names, over-long owner names and
sizes of 8 GiB or more get a pax ``x`` header first. For such plain names the bytes equal what
Python's ``tarfile`` writes in ``USTAR_FORMAT`` (checked by the tests), so every tar reader
accepts them.
"""

from __future__ import annotations

BLOCK = 512
RECORD = 20 * BLOCK
"""Archives are padded to a multiple of this, as ``tar`` and ``tarfile`` do."""

MAX_USTAR_SIZE = 8**11 - 1
_NAME_LEN = 100
_PREFIX_LEN = 155
_OWNER_LEN = 32
_PAX_NAME = b"././@PaxHeader"
_MAGIC = b"ustar\x0000"
_CHECKSUM_SPACES = 8 * ord(" ")
_REGULAR = b"0"
_PAX = b"x"


def pax_record(key: str, value: str) -> bytes:
    """One pax record, ``"<length> <key>=<value>\\n"``, where the length counts its own digits."""
    body = b" " + key.encode("ascii") + b"=" + value.encode("utf-8", "surrogateescape") + b"\n"
    digits = len(str(len(body)))
    while len(str(len(body) + digits)) != digits:
        digits += 1
    return str(len(body) + digits).encode("ascii") + body


def padding(size: int) -> bytes:
    """The zero bytes that follow a payload of ``size`` bytes up to the next block boundary."""
    return bytes(-size % BLOCK)


def end_of_archive(written: int) -> bytes:
    """Two zero blocks, then zeros up to the next record boundary, after ``written`` bytes."""
    end = written + 2 * BLOCK
    return bytes(2 * BLOCK + (-end % RECORD))


def _owner_field(name: str) -> tuple[bytes, bool]:
    """The ustar uname/gname field, and whether the name needs a pax record instead."""
    raw = name.encode("utf-8", "surrogateescape")
    fits = name.isascii() and len(raw) <= _OWNER_LEN
    return raw[:_OWNER_LEN].ljust(_OWNER_LEN, b"\0"), not fits


def split_ustar_name(name: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, name)`` fields for a name ustar can hold, or None when it needs pax.

    Uses the shortest prefix that works, as ``tarfile`` does, so the bytes match its output.
    """
    if len(name) <= _NAME_LEN:
        return b"", name
    cut = name.find(b"/")
    while 0 < cut <= _PREFIX_LEN:
        rest = name[cut + 1 :]
        if len(rest) <= _NAME_LEN:
            return (name[:cut], rest) if rest else None
        cut = name.find(b"/", cut + 1)
    return None


class HeaderMaker:
    """Builds the header blocks of regular-file members that share mode, owner and mtime."""

    def __init__(self, *, mode: int, mtime: int, uname: str, gname: str):
        if not 0 <= mtime <= MAX_USTAR_SIZE:
            raise ValueError(f"mtime {mtime} does not fit a tar header")
        uname_field, uname_pax = _owner_field(uname)
        gname_field, gname_pax = _owner_field(gname)
        self._owner_pax = b""
        if uname_pax:
            self._owner_pax += pax_record("uname", uname)
        if gname_pax:
            self._owner_pax += pax_record("gname", gname)
        # name[100] | mode uid gid | size[12] | mtime[12] | chksum[8] | type | linkname[100] |
        # magic version | uname gname | devmajor devminor (empty) | prefix[155] | pad[12]
        self._ids = b"%07o\0" % (mode & 0o7777) + b"0000000\0" * 2
        self._mtime = b"%011o\0" % mtime
        self._after_type = bytes(_NAME_LEN) + _MAGIC + uname_field + gname_field + bytes(16)
        self._fixed_sum = sum(self._ids) + sum(self._mtime) + _CHECKSUM_SPACES + sum(self._after_type)

    def member(self, name: str, size: int) -> bytes:
        """The header block(s) of a regular file ``name`` holding ``size`` bytes."""
        raw = name.encode("utf-8", "surrogateescape")
        split = split_ustar_name(raw) if name.isascii() else None
        records = self._owner_pax
        if split is None:
            records += pax_record("path", name)
            split = (b"", raw[:_NAME_LEN])
        if size > MAX_USTAR_SIZE:
            records += pax_record("size", str(size))
            size_field = b"00000000000\0"
        else:
            size_field = b"%011o\0" % size
        header = self._block(split[0], split[1], size_field, _REGULAR)
        if records:
            return (
                self._block(b"", _PAX_NAME, b"%011o\0" % len(records), _PAX)
                + records
                + padding(len(records))
                + header
            )
        return header

    def _block(self, prefix: bytes, name: bytes, size_field: bytes, kind: bytes) -> bytes:
        checksum = self._fixed_sum + sum(name) + sum(size_field) + kind[0] + sum(prefix)
        return b"".join(
            (
                name.ljust(_NAME_LEN, b"\0"),
                self._ids,
                size_field,
                self._mtime,
                b"%06o\0 " % checksum,
                kind,
                self._after_type,
                prefix.ljust(_PREFIX_LEN, b"\0"),
                bytes(12),
            )
        )
