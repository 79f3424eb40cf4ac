"""Tar members to samples, by webdataset's rules.

A sample is a run of *consecutive* members sharing a key: the member path up to the first dot
of its basename. The rest of the name, lower-cased, is the field name ("extension"). A key
seen again later starts a new sample; a repeated extension inside one sample is an error.
Members whose names mark them as metadata (``__*__``) are skipped, as are names without a dot.

Each sample also records where it starts (see :data:`POSITION`): the URL, the byte offset of
its first header and its ordinal in the shard. That position is what exact resumption seeks to.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdsx.core.errors import DuplicateFieldError, ShardError, TrailingDataError
from wdsx.state.position import Position

POSITION = "__position__"
"""Sample field holding the :class:`~wdsx.state.position.Position` of the sample's first
tar header: URL, byte offset, ordinal in the shard, padding flag."""

_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")


def split_key(name: str) -> tuple[str, str] | None:
    """Split a member name into ``(key, extension)``; None when the name has no extension.

    Matches webdataset's ``base_plus_ext`` exactly, including its treatment of dots in
    directory names and of basenames that start with a dot.
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:
        return name[:dot], name[dot + 1 :]
    match = _KEY_RE.match(name)
    return (match.group(1), match.group(2)) if match else None


def is_meta(name: str) -> bool:
    """True for members webdataset skips as metadata: ``__x__`` at top level or as a leading dir."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return _META_RE.match(name) is not None


def field_of(
    name: str,
    rename_files: Callable[[str], str] | None = None,
    select_files: Callable[[str], bool] | None = None,
) -> tuple[str, str] | None:
    """``(key, lower-cased extension)`` of a member, or None when it is skipped: metadata,
    not selected, or without an extension. Renaming happens before selection, as in webdataset."""
    if name[:2] == "__" and is_meta(name):
        return None
    if rename_files is not None:
        name = rename_files(name)
    if select_files is not None and not select_files(name):
        return None
    split = split_key(name)
    return None if split is None else (split[0], split[1].lower())


def sample_starts(
    members: Iterable[tuple[str, int, Any]],
    rename_files: Callable[[str], str] | None = None,
    select_files: Callable[[str], bool] | None = None,
) -> Iterator[tuple[int, int]]:
    """``(ordinal, offset)`` of each sample's first member, by the same rules as
    :func:`group_members`, from ``(name, offset, _)`` member records (e.g. a header scan)."""
    key = None
    ordinal = -1
    for name, offset, _ in members:
        field = field_of(name, rename_files, select_files)
        if field is not None and field[0] != key:
            key = field[0]
            ordinal += 1
            yield ordinal, offset


class Cursor:
    """Where the next sample of a shard starts (its byte offset, None when only the ordinal is
    known, and its ordinal); updated as samples are yielded. ``done``: the piece is read."""

    __slots__ = ("offset", "ordinal", "done")

    def __init__(self, offset: int | None, ordinal: int):
        self.offset = offset
        self.ordinal = ordinal
        self.done = False


class StreamStopped(Exception):
    """Raised by a reader whose error handler, asked about one bad record, chose to end the
    stream: the handler has had its say, so the reading stage stops without asking again."""


def beyond_count(url: str, offset: int, count: int, unit: str = "samples") -> ShardError:
    """The error for a shard that holds more than its known sample count: a manifest written
    before the shard was rewritten (or a wrong ``counts=``) would otherwise add samples that
    the epoch's plan, and every other rank, does not expect."""
    return ShardError(
        url,
        offset,
        f"the shard holds more than {count} {unit}, its sample count (from its manifest or counts=): "
        "the manifest no longer describes the shard (rewritten since?); `wdsx index` writes a new one",
    )


def group_members(
    members: Iterable[tuple[str, int, bytes]],
    url: str,
    cursor: Cursor,
    *,
    stop: int | None = None,
    rename_files: Callable[[str], str] | None = None,
    select_files: Callable[[str], bool] | None = None,
    extra: dict[str, Any] | None = None,
    handler: Callable[[Exception], bool] | None = None,
) -> Iterator[dict[str, Any]]:
    """Group ``(name, offset, data)`` members into sample dicts.

    ``cursor`` starts at the first sample's offset and ordinal; after each sample is yielded
    it holds the next sample's. Grouping stops before ordinal ``stop``. ``extra`` fields
    (such as ``__local_path__``) are added to every sample. A second member with a sample's
    extension is a :class:`ShardError`, raised, or given to ``handler``: one that continues
    drops that member and reads on (the sample keeps its first, as on webdataset), one that
    stops ends the stream (:class:`StreamStopped`). Where the members end in a
    :class:`TrailingDataError`, the last sample is yielded before it is raised.
    """
    sample: dict[str, Any] = {}
    key: str | None = None
    ordinal = cursor.ordinal
    if stop is not None and ordinal >= stop:
        cursor.done = True
        return
    plain = rename_files is None and select_files is None
    new_tuple = tuple.__new__  # Position(...) without its constructor's overhead, per sample
    try:
        for name, offset, data in members:
            # The common case of field_of(), inlined: this loop runs once per tar member. When the
            # name's first dot is in its basename ("/" does not follow it) and the basename does
            # not start with it, that dot splits key from extension; any other name takes field_of.
            prefix, dot, ext = name.partition(".")
            if (
                plain
                and dot
                and "/" not in ext
                and prefix[-1:] not in "/"
                and name[:2] != "__"
                and "\n" not in name
            ):
                ext = ext.lower()
            else:
                field = field_of(name, rename_files, select_files)
                if field is None:
                    continue
                prefix, ext = field
            if prefix != key:
                if key is not None:
                    ordinal += 1
                    cursor.offset = offset
                    cursor.ordinal = ordinal
                    if stop is not None and ordinal >= stop:
                        cursor.done = True
                        yield sample
                        return
                    yield sample
                key = prefix
                sample = {
                    "__key__": prefix,
                    "__url__": url,
                    ext: data,
                    POSITION: new_tuple(Position, (url, offset, ordinal, False)),
                }
                if extra:
                    sample.update(extra)
            elif ext in sample:
                error = DuplicateFieldError(
                    url, offset, f"duplicate extension {ext!r} in sample {prefix!r}", name
                )
                if handler is None:
                    raise error
                if not handler(error):
                    raise StreamStopped from error
            else:
                sample[ext] = data
    except TrailingDataError:  # raised after the end of the archive: the sample held is whole
        if key is not None:
            cursor.ordinal, cursor.done = ordinal + 1, True
            yield sample
        raise
    cursor.done = True
    if key is not None:
        cursor.ordinal = ordinal + 1
        yield sample
