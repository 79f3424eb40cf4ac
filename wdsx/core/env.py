"""Environment variables wdsx reads, under webdataset's names where webdataset has one.

Each is read when it matters (not once at import), so that setting one in a running program,
or for DataLoader workers, takes effect.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from wdsx.core.rng import derive_seed

Number = TypeVar("Number", int, float)

ALLOW_PICKLE = "WDSX_ALLOW_PICKLE"
"""The one switch that lets decoders run pickle: ``.pyd``/``.pickle``/``.pkl`` fields are
unpickled and ``.pth`` fields are loaded with ``torch.load(weights_only=False)`` only when it
is ``1``. Off by default, as in PyTorch >= 2.6: unpickling a shard from elsewhere runs
whatever code its author put there."""


def _flag(name: str) -> bool:
    """An on/off variable that is on unless unset, empty or ``0``: a stray value (``false``)
    turns it on, which for ``WDS_SECURE`` is the safe side."""
    return os.environ.get(name, "0") not in ("", "0")


def secure_mode() -> bool:
    """``WDS_SECURE=1`` (webdataset's ``utils.enforce_security``): refuse what can run code or
    reach beyond the shards named, as webdataset does: ``pipe:`` commands, pickle and
    ``torch.load`` (even when :data:`ALLOW_PICKLE` is set), ``GOPEN_REWRITE`` rules, and local
    files opened through webdataset's ``gopen``."""
    return _flag("WDS_SECURE")


def pickle_allowed() -> bool:
    """Whether decoders may unpickle: :data:`ALLOW_PICKLE` is ``1`` and secure mode is off.
    Any value but ``1``, ``0`` or empty is refused with a ValueError: ``false`` or ``no`` must
    not read as yes, nor ``yes`` as no, in the switch that lets a shard run code."""
    value = os.environ.get(ALLOW_PICKLE, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{ALLOW_PICKLE}={value!r}: set it to 1 to let decoders unpickle, or to 0 (or unset it) to refuse"
        )
    return value == "1" and not secure_mode()


def seed_number(seed: int | str) -> int:
    """A seed as the number wdsx's random streams take: an int, or text that reads as one,
    as it is; any other text (webdataset takes any) through a hash of it, the same in every
    process and run."""
    if isinstance(seed, int):
        return seed
    try:
        return int(seed)
    except ValueError:
        return derive_seed("seed text", seed)


def seed_from_environment() -> int:
    """``WDS_SEED``, else 0: the same seed on every rank and every restart."""
    return seed_number(os.environ.get("WDS_SEED", "0"))


def number_from_environment(name: str, kind: Callable[[str], Number], what: str) -> Number | None:
    """The variable ``name`` read as ``kind`` (``int``, ``float``); None when it is unset or
    empty; a ``ValueError`` naming the variable and ``what`` it must be when it does not parse."""
    value = os.environ.get(name)
    if not value:
        return None
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be {what}, not {value!r}") from None
