"""Environment variables wdsx reads, under webdataset's names where webdataset has one.

Each is read when it matters (not once at import), so that setting one in a running program,
or for DataLoader workers, takes effect.
"""

from __future__ import annotations

import os

ALLOW_PICKLE = "WDSX_ALLOW_PICKLE"
"""The one switch that lets decoders run pickle: ``.pyd``/``.pickle``/``.pkl`` fields are
unpickled and ``.pth`` fields are loaded with ``torch.load(weights_only=False)`` only when it
is ``1``. Off by default, as in PyTorch >= 2.6: unpickling a shard from elsewhere runs
whatever code its author put there."""

MAX_MEMBER = "WDSX_MAX_MEMBER_BYTES"
DEFAULT_MAX_MEMBER = 1 << 34
"""16 GiB: the largest tar member a reader accepts unless ``WDSX_MAX_MEMBER_BYTES`` says
otherwise. Members are never allocated beyond what the stream delivers; this only bounds what
a stream of unknown length (a pipe, a decompressor) may make a reader hold."""


def _flag(name: str) -> bool:
    return os.environ.get(name, "0") not in ("", "0")


def secure_mode() -> bool:
    """``WDS_SECURE=1``: refuse what can run code: ``pipe:`` commands and pickle (even when
    :data:`ALLOW_PICKLE` is set); ``.pth`` fields load with ``weights_only=True`` only."""
    return _flag("WDS_SECURE")


def pickle_allowed() -> bool:
    """Whether decoders may unpickle: :data:`ALLOW_PICKLE` is set and secure mode is off."""
    return _flag(ALLOW_PICKLE) and not secure_mode()


def max_member_bytes() -> int:
    """The per-member size limit of readers: ``WDSX_MAX_MEMBER_BYTES``, else 16 GiB."""
    value = os.environ.get(MAX_MEMBER)
    if not value:
        return DEFAULT_MAX_MEMBER
    try:
        limit = int(value)
    except ValueError:
        raise ValueError(f"{MAX_MEMBER} must be a number of bytes, not {value!r}") from None
    if limit <= 0:
        raise ValueError(f"{MAX_MEMBER} must be positive, not {value!r}")
    return limit


def seed_from_environment() -> int:
    """``WDS_SEED``, else 0: the same seed on every rank and every restart."""
    return int(os.environ.get("WDS_SEED", "0"))
