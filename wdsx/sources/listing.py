"""Expand a location into the shards it names: a remote prefix or glob, a local glob or directory.

``s3://bucket/data/`` (trailing slash) names every shard object under the prefix (``.tar``,
and its compressed forms); ``s3://bucket/data/train-*.tar`` names the objects matching the glob
(``*``, ``?``, ``[...]``; ``*`` also matches ``/``). Only the literal part before the first
glob character is listed, page by page. Every store with a lister (``s3://``, ``gs://``,
``az://``, ``hf://``, fsspec protocols) works the same way, and so do local paths; a local
directory names its shards with or without the trailing slash.

Local shards named one by one can be checked before anything is read
(:func:`missing_local_shards`): a typo at the end of a brace range is then found at once, not
when a reader reaches that shard.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import braceexpand

from wdsx.core.compression import SHARD_SUFFIXES
from wdsx.sources.base import SourceOptions
from wdsx.sources.local import local_path

_GLOB_CHAR = re.compile(r"[*?[]")

Lister = Callable[[str, SourceOptions], Iterable[str]]
"""Every object URL that starts with a literal URL prefix (``gs://bucket/data/train-``).

Raises :class:`~wdsx.sources.retry.TransientError` for a failure worth another attempt (the
whole listing is then repeated) and :class:`~wdsx.core.errors.SourceError` for others."""


COMPANIONS = ("manifest.json", ".idx")
"""The files wdsx writes beside shards (manifests, offset indexes): a glob never names them."""


def list_shards(pattern: str, options: SourceOptions | None = None) -> list[str]:
    """The sorted shard URLs ``pattern`` names; ``[pattern]`` when it is a single shard.

    A glob or prefix that matches nothing gives an empty list. URLs of schemes that cannot
    list (``http(s)://``, ``pipe:``) are returned unchanged.
    """
    options = options or SourceOptions()
    path = local_path(pattern)
    if path is None:
        return _list_remote(pattern, options)
    scheme = pattern[: len(pattern) - len(path)]
    if _GLOB_CHAR.search(path):
        found = [name for name in glob.glob(path, recursive=True) if not name.endswith(COMPANIONS)]
    elif path.endswith("/") or os.path.isdir(path):
        found = [name for name in _files_under(path) if name.endswith(SHARD_SUFFIXES)]
    else:
        return [pattern]
    return sorted(scheme + name for name in found)


def names_several(url: str) -> bool:
    """Whether ``url`` names a set of shards to list rather than one shard: a glob, a prefix
    (``.../``) of a store that can list, or a local directory. ``pipe:`` commands never do."""
    if url.startswith("pipe:"):
        return False
    path = local_path(url)
    if path is not None:
        return bool(_GLOB_CHAR.search(path)) or path.endswith("/") or os.path.isdir(path)
    from wdsx.sources import lister_for

    return bool(_GLOB_CHAR.search(url)) or (url.endswith("/") and lister_for(url) is not None)


def missing_local_shards(urls: Sequence[str]) -> list[str]:
    """The local shard URLs of ``urls`` that name no file (remote ones are not looked up): one
    ``stat`` each, so that a list known up front is checked before the first batch."""
    return [url for url in urls if (path := local_path(url)) is not None and not os.path.exists(path)]


def list_local(prefix: str, options: SourceOptions) -> list[str]:
    """Every local file URL starting with ``prefix`` (a directory's, or a name's beginning)."""
    path = local_path(prefix) or prefix
    scheme = prefix[: len(prefix) - len(path)]
    directory = path[: path.rfind("/") + 1]
    return [scheme + name for name in _files_under(directory or ".", directory) if name.startswith(path)]


def _files_under(directory: str, spelled: str | None = None) -> Iterator[str]:
    """The files under ``directory``, at any depth, named as ``spelled`` (by default, the
    directory itself, with a ``/`` after it) followed by their path inside it."""
    spelled = directory.rstrip("/") + "/" if spelled is None else spelled
    for root, _, names in os.walk(directory):
        inside = os.path.relpath(root, directory)
        for name in names:
            yield spelled + (name if inside == "." else f"{inside}/{name}")


def _selection(pattern: str) -> tuple[str, Callable[[str], bool]] | None:
    """The literal prefix to list and the test each listed URL must pass."""
    glob_char = _GLOB_CHAR.search(pattern)
    if glob_char:
        return pattern[
            : glob_char.start()
        ], lambda url: fnmatch.fnmatchcase(url, pattern) and not url.endswith(COMPANIONS)
    if pattern.endswith("/"):
        return pattern, lambda url: url.endswith(SHARD_SUFFIXES)
    return None


def _list_remote(pattern: str, options: SourceOptions) -> list[str]:
    from wdsx.sources import lister_for
    from wdsx.sources.retry import call_with_retries

    selection = _selection(pattern)
    lister = lister_for(pattern) if selection is not None else None
    if selection is None or lister is None:
        return [pattern]
    prefix, wanted = selection
    urls = call_with_retries(pattern, options, "listing", lambda: list(lister(prefix, options)))
    return sorted(url for url in urls if wanted(url))


class UnsetVariableError(KeyError, ValueError):
    """A ``${VAR}`` in a URL whose ``WDS_VAR`` is not set: a KeyError, as a missing name in a
    mapping is, and a ValueError, as a URL that cannot be used is (what callers catch)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def envsubst(url: str) -> str:
    """Replace ``${VAR}`` with the value of the environment variable ``WDS_VAR``."""

    def lookup(match: re.Match) -> str:
        name = "WDS_" + match.group(1)
        if name not in os.environ:
            raise UnsetVariableError(
                f"{url}: environment variable {name} is not set (for ${{{match.group(1)}}})"
            )
        return os.environ[name]

    return re.sub(r"\$\{(\w+)\}", lookup, url)


def expand_urls(urls: str | Iterable[str], options: SourceOptions | None = None) -> list[str]:
    """Expand a pattern string (or pass a list through) into the list of shard URLs;
    ``options`` are used to list S3 prefixes and globs."""
    if not isinstance(urls, str):
        return [str(url) for url in urls]
    result: list[str] = []
    for pattern in urls.split("::"):
        for _ in range(10):
            substituted = envsubst(pattern)
            if substituted == pattern:
                break
            pattern = substituted
        for url in braceexpand.braceexpand(pattern):
            result.extend(_listed(url, options))
    return result


def _listed(url: str, options: SourceOptions | None) -> list[str]:
    """A URL, or the shards a glob, a remote prefix (``s3://.../``, ``gs://.../``...) or a local
    directory names."""
    if not names_several(url):
        return [url]
    found = list_shards(url, options)
    if not found:
        raise ValueError(f"{url}: the pattern matches no shards")
    return found
