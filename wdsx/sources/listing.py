"""Expand a location into the shards it names: an S3 prefix or glob, a local glob or directory.

``s3://bucket/data/`` (trailing slash) names every shard object under the prefix (``.tar``,
and its compressed forms); ``s3://bucket/data/train-*.tar`` names the keys matching the glob (``*``,
``?``, ``[...]``; ``*`` also matches ``/``). Only the literal part before the first glob
character is listed, page by page. Local paths work the same way.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Callable

from wdsx.core.compression import SHARD_SUFFIXES
from wdsx.sources.base import SourceOptions
from wdsx.sources.local import local_path

_GLOB_CHAR = re.compile(r"[*?[]")


def list_shards(pattern: str, options: SourceOptions | None = None) -> list[str]:
    """The sorted shard URLs ``pattern`` names; ``[pattern]`` when it is a single shard.

    A glob or prefix that matches nothing gives an empty list. URLs other than ``s3://`` and
    local paths are returned unchanged.
    """
    options = options or SourceOptions()
    if pattern.startswith("s3://"):
        return _list_s3(pattern, options)
    path = local_path(pattern)
    if path is None:
        return [pattern]
    scheme = pattern[: len(pattern) - len(path)]
    if _GLOB_CHAR.search(path):
        found = glob.glob(path, recursive=True)
    elif path.endswith("/"):
        found = [
            os.path.join(directory, name)
            for directory, _, names in os.walk(path)
            for name in names
            if name.endswith(SHARD_SUFFIXES)
        ]
    else:
        return [pattern]
    return sorted(scheme + name for name in found)


def _key_filter(key_pattern: str) -> tuple[str, Callable[[str], bool]] | None:
    """The literal prefix to list and the test each listed key must pass."""
    glob_char = _GLOB_CHAR.search(key_pattern)
    if glob_char:
        return key_pattern[: glob_char.start()], lambda key: fnmatch.fnmatchcase(key, key_pattern)
    if key_pattern == "" or key_pattern.endswith("/"):
        return key_pattern, lambda key: key.endswith(SHARD_SUFFIXES)
    return None


def _list_s3(pattern: str, options: SourceOptions) -> list[str]:
    from wdsx.sources.retry import call_with_retries
    from wdsx.sources.s3 import s3_client, s3_errors, split_s3_url

    bucket, key_pattern = split_s3_url(pattern)
    selection = _key_filter(key_pattern)
    if selection is None:
        return [pattern]
    prefix, wanted = selection

    def list_all() -> list[str]:
        keys = []
        with s3_errors(pattern, f"ListObjectsV2 with prefix {prefix!r}"):
            pages = s3_client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                keys.extend(item["Key"] for item in page.get("Contents", ()))
        return keys

    keys = call_with_retries(pattern, options, "listing", list_all)
    return sorted(f"s3://{bucket}/{key}" for key in keys if wanted(key))
