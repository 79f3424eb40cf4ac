"""Small general helpers webdataset exposes in ``utils`` and ``cache``: brace-aware globbing
and matching, the iterable test, seeds, and the URL inside a ``pipe:`` command."""

from __future__ import annotations

import fnmatch
import glob
import re
from collections.abc import Iterable
from typing import Any

import braceexpand

from wdsx.core.topology import pytorch_worker_info


def glob_with_braces(pattern: str) -> list[str]:
    """The files matching ``pattern`` after brace expansion (``"a/{x,y}/*.tar"``)."""
    return [name for expanded in braceexpand.braceexpand(pattern) for name in glob.glob(expanded)]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    """Whether ``filename`` matches ``pattern`` after brace expansion."""
    return any(fnmatch.fnmatch(filename, expanded) for expanded in braceexpand.braceexpand(pattern))


def is_iterable(obj: Any) -> bool:
    """True for iterables and iterators other than strings and bytes."""
    return not isinstance(obj, (str, bytes)) and isinstance(obj, Iterable)


def make_seed(*args: Any) -> int:
    """A 31-bit seed from the hashes of ``args`` (webdataset's formula; strings hash
    differently in every process unless PYTHONHASHSEED is set)."""
    seed = 0
    for arg in args:
        seed = (seed * 31 + hash(arg)) & 0x7FFFFFFF
    return seed


def pytorch_worker_seed(group: Any = None) -> int:
    """A seed distinct for each rank and DataLoader worker: ``rank * 1000 + worker``."""
    rank, _, worker, _ = pytorch_worker_info(group=group)
    return rank * 1000 + worker


_REMOTE_WORD = re.compile(r"^(https?|hdfs|gs|ais|s3):")


def pipe_cleaner(spec: str) -> str:
    """The URL a ``pipe:`` command fetches (its first ``http(s)://``, ``s3://``, ``gs://``...
    word), else the command without ``pipe:``; other specs are returned unchanged. It names
    cache entries in webdataset; ``WebDataset(url_to_name=...)`` accepts it (wdsx's cache
    names entries by URL hash)."""
    if not spec.startswith("pipe:"):
        return spec
    command = spec[len("pipe:") :]
    return next((word for word in command.split(" ") if _REMOTE_WORD.match(word)), command)
