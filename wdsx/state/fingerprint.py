"""Checkpoints tied to their data: the identity of every shard a checkpoint was taken on.

A checkpoint's positions are byte offsets and ordinals in particular shards, so resuming it on
other data silently reads other samples (or fails deep inside a tar). ``state_dict()`` therefore
records, in the checkpoint's ``data`` field, each shard of the dataset with what identifies its
content cheaply::

    "data": {"shards": [["/data/train-000000.tar", 81920, "9f2c...e1"], ...]}

* the SHA-256 from the dataset's manifest, when it lists one (a real content hash, and free:
  the manifest is read anyway);
* the size in bytes: of the file itself for a local shard (one ``stat``; it catches a shard
  rewritten, re-encoded or truncated, the usual accidents), else the manifest's;
* nothing for a remote shard without a manifest: asking every object store for its ETag would
  cost a request per shard each time a pipeline is made, so such a shard is only checked for
  being in the list.

Modification times are left out on purpose: copying a dataset (to a node's local disk, from
a backup) changes them without changing a byte, and a resume should not fail for that.

Loading compares the recorded identities with the dataset's and refuses a difference with a
:class:`StateError` naming each shard added, removed, resized or with other content, unless the
caller says the change is intended. Checkpoints written before this field existed carry none
and load without the check.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from wdsx.core.errors import StateError
from wdsx.state import validate

JsonDict = dict[str, Any]

Identity = tuple[int | None, str | None]
"""A shard's size in bytes and SHA-256 (hex), each None when not known."""

SHOWN = 8
"""Changes a refusal lists one by one before it says how many more there are."""

CHOICES = ("error", "allow")
"""What ``load_state_dict(..., data_changed=...)`` accepts."""


def local_size(url: str) -> int | None:
    """The size of the shard at ``url`` when it is a local file (a path or ``file:`` URL) that
    exists; None otherwise."""
    if url.startswith("file://"):
        path = url[len("file://") :]
    elif url.startswith("file:"):
        path = url[len("file:") :]
    elif "://" in url or url.startswith("pipe:"):
        return None
    else:
        path = url
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def identities(reader: Any) -> list[tuple[str, Identity]]:
    """The shards a pipeline's reader stage reads (its ``shard_urls()``), each with its size
    (a local file's own, else the manifest's) and the manifest's SHA-256, from the reader's
    read settings where it has them."""
    settings = getattr(reader, "settings", None)
    found = []
    for url in reader.shard_urls() or ():
        size = local_size(url)
        sha256 = None
        if settings is not None:
            size = settings.expected_size(url) if size is None else size
            sha256 = settings.expected_hash(url)
        found.append((url, (size, sha256)))
    return found


def record(shards: Iterable[tuple[str, Identity]]) -> JsonDict:
    """The ``data`` field of a checkpoint for ``shards`` (URL and identity, in dataset order)."""
    return {"shards": [[url, size, sha256] for url, (size, sha256) in shards]}


def parse(data: Any) -> dict[str, Identity]:
    """The shards of a ``data`` field :func:`record` wrote, by URL; :class:`InvalidState` names
    the entry that is not ``[url, size or null, sha256 or null]``."""
    with validate.within("data"):
        entries = validate.listing(validate.mapping(data), "shards")
        shards: dict[str, Identity] = {}
        for index, entry in enumerate(entries):
            ok = isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
            ok = ok and (entry[1] is None or (type(entry[1]) is int and entry[1] >= 0))
            ok = ok and (entry[2] is None or isinstance(entry[2], str))
            if not ok:
                expected = "[shard URL, size or null, sha256 or null]"
                raise validate.InvalidState(["shards", index], expected, entry)
            shards[entry[0]] = (entry[1], entry[2])
    return shards


def changes(saved: dict[str, Identity], current: dict[str, Identity]) -> list[str]:
    """What differs between the shards a checkpoint was taken on and the dataset's, one line
    per shard: removed, added, resized, or other content (by SHA-256). A size or hash known on
    one side only is not a difference."""
    found = [f"shard {url} removed" for url in saved if url not in current]
    found += [f"shard {url} added" for url in current if url not in saved]
    for url, (size, sha256) in saved.items():
        if url not in current:
            continue
        now_size, now_sha256 = current[url]
        if size is not None and now_size is not None and size != now_size:
            found.append(f"shard {url} resized ({size} bytes in the checkpoint, {now_size} now)")
        elif sha256 is not None and now_sha256 is not None and sha256 != now_sha256:
            hashes = f"sha256 {sha256[:12]}... then, {now_sha256[:12]}... now"
            found.append(f"shard {url} has other content ({hashes})")
    return found


def allowed(data_changed: str) -> bool:
    """Whether ``load_state_dict(..., data_changed=...)`` allows resuming on changed data."""
    if data_changed not in CHOICES:
        raise ValueError(f"data_changed must be one of {CHOICES}, got {data_changed!r}")
    return data_changed == "allow"


def check(saved: JsonDict, current: dict[str, Identity], allow: bool) -> list[str]:
    """Compare a checkpoint's ``data`` field with the dataset's shards. Raises
    :class:`StateError` naming what changed unless ``allow``; returns the changes (for the
    caller to log)."""
    found = changes(parse(saved), current)
    if found and not allow:
        listed = "; ".join(found[:SHOWN]) + (f"; and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
        raise StateError(
            f"the checkpoint was taken on other shards: {listed}. Resume on the data it was taken on, "
            'or pass data_changed="allow" to load_state_dict if the change is intended'
        )
    return found
