"""webdataset's low-level reading generators, for pipelines that assemble their own reading:
URL dicts -> open streams (:func:`url_opener`) -> tar members (:func:`tar_file_expander`) ->
samples (:func:`group_by_keys`, whose ``keys`` function can be replaced).

They take and yield the same dicts as webdataset's, over wdsx's tar parser and sources. The
end-of-shard marker :data:`END_OF_SHARD` suits both generations of grouping code: it equals
``{}``, as webdataset 1.0's grouping tests, and its ``"fname"`` names no sample, which grouping
written for 0.2 (reading ``"fname"`` and ``"data"`` from every item) passes over.
Being opaque functions of the stream they cannot be checkpointed; ``tarfile_to_samples``
(or ``WebDataset``) reads the same shards resumably. A shard that ends early is an error
here too, never a silent end.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import braceexpand

from wdsx.core.compression import uncompressed
from wdsx.core.errors import Handler, reraise_exception
from wdsx.read.samples import split_key
from wdsx.read.tar import iter_members
from wdsx.sources.gopen import gopen

META_PATTERN = r"__[^/]*__($|/)"
"""Members whose names match this (``__x__`` files and directories) are metadata."""


class EndOfShard(dict):
    """An empty dict that marks the end of a shard's members.

    It is ``{}`` to every test (equal, empty, false), so webdataset 1.0-style grouping ends
    the sample there; yet reading ``marker["fname"]`` gives ``""`` and ``marker["data"]``
    gives ``b""``, as code written for webdataset 0.2 does with every item (such code raised
    ``KeyError: 'fname'`` on a plain ``{}``): :func:`base_plus_ext` of ``""`` is
    ``(None, None)``, an item that grouping skips, as if no marker had come."""

    __slots__ = ()

    def __missing__(self, key: str) -> Any:
        if key == "fname":
            return ""
        if key == "data":
            return b""
        raise KeyError(key)


END_OF_SHARD = EndOfShard()
"""What :func:`tar_file_expander` yields after each shard's members by default."""


def base_plus_ext(path: str) -> tuple[str, str] | tuple[None, None]:
    """``(key, extensions)`` of a member name: the path up to the first dot of its basename,
    and the rest; ``(None, None)`` when the basename has no extension."""
    split = split_key(path)
    return (None, None) if split is None else split


def valid_sample(sample: Any) -> bool:
    """Whether ``sample`` is a non-empty dict not marked ``__bad__``."""
    return isinstance(sample, dict) and len(sample) > 0 and not sample.get("__bad__", False)


def shardlist(urls: str | Iterable[str], *, shuffle: bool = False) -> Iterator[dict[str, str]]:
    """``{"url": ...}`` for each URL (a string is brace-expanded), in a random order (from
    Python's global ``random``) with ``shuffle``."""
    listed = list(braceexpand.braceexpand(urls)) if isinstance(urls, str) else list(urls)
    if shuffle:
        random.shuffle(listed)
    for url in listed:
        yield {"url": url}


def url_opener(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, **kw: Any
) -> Iterator[dict]:
    """Each ``{"url": ...}`` dict with ``stream`` added: the URL opened with :func:`wdsx.gopen`
    (``kw`` goes to it)."""
    for item in data:
        try:
            item["stream"] = gopen(item["url"], **kw)
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield item


def tar_file_iterator(
    fileobj: BinaryIO,
    skip_meta: str | None = META_PATTERN,
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
    *,
    url: str = "<stream>",
) -> Iterator[dict[str, Any]]:
    """``{"fname": name, "data": bytes}`` for each regular file of a tar stream (gzip, bzip2
    and xz are recognised); ``url`` names the stream in errors."""
    stream, _ = uncompressed(fileobj.read, getattr(fileobj, "readinto", None))
    for name, _, data in iter_members(stream, url):
        try:
            if "/" not in name and name.startswith("__") and name.endswith("__"):
                continue
            if skip_meta is not None and re.match(skip_meta, name):
                continue
            if rename_files is not None:
                name = rename_files(name)
            if select_files is not None and not select_files(name):
                continue
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield {"fname": name, "data": data}


def tar_file_expander(
    data: Iterable[dict[str, Any]],
    handler: Handler = reraise_exception,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
    eof_value: Any = END_OF_SHARD,
) -> Iterator[dict[str, Any]]:
    """The members of each opened stream (from :func:`url_opener`) with ``__url__`` (and
    ``__local_path__`` when known), then ``eof_value`` after each shard (None: nothing), so
    that grouping never joins samples across shards. Streams are closed once read."""
    for source in data:
        url = source["url"]
        try:
            members = tar_file_iterator(
                source["stream"],
                handler=handler,
                select_files=select_files,
                rename_files=rename_files,
                url=url,
            )
            for member in members:
                member["__url__"] = url
                if source.get("local_path") is not None:
                    member["__local_path__"] = source["local_path"]
                yield member
            if eof_value is not None:
                yield eof_value
        except Exception as exn:
            if handler(exn):
                continue
            break
        finally:
            stream = source.get("stream")
            if stream is not None:
                stream.close()


def group_by_keys(
    data: Iterable[dict[str, Any]],
    keys: Callable[[str], tuple[Any, Any]] = base_plus_ext,
    lcase: bool = True,
    suffixes: set[str] | None = None,
    handler: Handler = reraise_exception,
) -> Iterator[dict[str, Any]]:
    """Samples from consecutive members that share a key (``keys(fname)`` gives the key and
    the field name); an empty dict (such as :data:`END_OF_SHARD`) ends the current sample.
    Only ``suffixes`` are kept when given; a field seen twice in one sample is an error."""
    sample: dict[str, Any] | None = None
    for member in data:
        try:
            if member == {}:
                if sample is not None and valid_sample(sample):
                    yield sample
                sample = None
                continue
            prefix, suffix = keys(member["fname"])
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()
            if sample is None or prefix != sample["__key__"]:
                if sample is not None and valid_sample(sample):
                    yield sample
                sample = {"__key__": prefix, "__url__": member["__url__"]}
            if suffix in sample:
                raise ValueError(f"{member['fname']}: field {suffix!r} appears twice in sample {prefix!r}")
            if suffixes is None or suffix in suffixes:
                sample[suffix] = member["data"]
            if member.get("__local_path__") is not None:
                sample["__local_path__"] = member["__local_path__"]
        except Exception as exn:
            if handler(exn):
                continue
            break
    if sample is not None and valid_sample(sample):
        yield sample
