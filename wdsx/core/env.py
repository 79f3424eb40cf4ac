"""Environment variables wdsx reads, under webdataset's names."""

from __future__ import annotations

import os


def secure_mode() -> bool:
    """``WDS_SECURE=1``: refuse what can run code: ``pipe:`` commands, pickle, ``torch.load``."""
    return os.environ.get("WDS_SECURE", "0") not in ("", "0")


def seed_from_environment() -> int:
    """``WDS_SEED``, else 0: the same seed on every rank and every restart."""
    return int(os.environ.get("WDS_SEED", "0"))
