"""webdataset 0.2's cached tar reading: ``cached_url_opener`` and the stages built on it.

Programs pinned to webdataset 0.2 read shards through a directory cache with these (webdataset
1.0 replaced them with ``FileCache``). Shards are copied whole with
:func:`wdsx.sources.filecache.get_file_cached`, then read with wdsx's tar reader; wdsx's own
``WebDataset(cache_dir=...)`` is the resumable way to cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdsx.core.errors import Handler, log, reraise_exception
from wdsx.core.utilities import pipe_cleaner
from wdsx.read.members import group_by_keys, tar_file_expander
from wdsx.sources.filecache import check_tar_format, get_file_cached, get_filetype, verbose_cache
from wdsx.stages.base import Stage, pipelinefilter
from wdsx.stages.reading import tarfile_to_samples


def cached_url_opener(
    data: Iterable[dict[str, Any]],
    handler: Handler = reraise_exception,
    cache_size: float = -1,
    cache_dir: str | None = None,
    url_to_name: Callable[[str], str] = pipe_cleaner,
    validator: Callable[[str], bool] = check_tar_format,
    verbose: bool = False,
    always: bool = False,
) -> Iterator[dict[str, Any]]:
    """Each ``{"url": ...}`` with ``stream`` added, opened from its cached copy (local files in
    place unless ``always``). A copy that fails ``validator`` is deleted and raises ValueError;
    errors carry the URL as their last argument and go to ``handler``."""
    verbose = verbose or bool(verbose_cache())
    for sample in data:
        url = sample["url"]
        try:
            if not always and os.path.exists(url):
                dest = url
            else:
                dest = get_file_cached(
                    url, cache_size=cache_size, cache_dir=cache_dir, url_to_name=url_to_name, verbose=verbose
                )
            if verbose:
                log.info("cache: opening %s", dest)
            if not validator(dest):
                kind = get_filetype(dest)
                with open(dest, "rb") as stream:
                    start = stream.read(200)
                os.remove(dest)
                raise ValueError(f"{dest} ({url}) is not a tar archive, but a {kind}, contains {start!r}")
            sample.update(stream=open(dest, "rb"))  # noqa: SIM115 - the tar reader closes it
        except Exception as exn:
            exn.args = (*exn.args, url)
            if handler(exn):
                continue
            break
        yield sample


def cached_tarfile_samples(
    src: Iterable[dict[str, Any]],
    handler: Handler = reraise_exception,
    cache_size: float = -1,
    cache_dir: str | None = None,
    verbose: bool = False,
    url_to_name: Callable[[str], str] = pipe_cleaner,
    always: bool = False,
    select_files: Callable[[str], bool] | None = None,
    rename_files: Callable[[str], str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Samples from ``{"url": ...}`` items, each shard read from its cached copy."""
    streams = cached_url_opener(
        src,
        handler=handler,
        cache_size=cache_size,
        cache_dir=cache_dir,
        verbose=verbose,
        url_to_name=url_to_name,
        always=always,
    )
    files = tar_file_expander(streams, handler=handler, select_files=select_files, rename_files=rename_files)
    return group_by_keys(files, handler=handler)


cached_tarfile_to_samples = pipelinefilter(cached_tarfile_samples)
"""The stage form of :func:`cached_tarfile_samples`."""


def maybe_cached_tarfile_to_samples(
    src: Any = None,
    handler: Handler = reraise_exception,
    cache_size: float = -1,
    cache_dir: str | None = None,
    verbose: bool = False,
    url_to_name: Callable[[str], str] = pipe_cleaner,
    always: bool = False,
) -> Stage:
    """webdataset 0.2's choice of stage: plain tar reading without ``cache_dir`` (or with
    ``cache_size == 1``), cached reading otherwise. ``src`` is not used, as in webdataset."""
    if cache_dir is None or cache_size == 1:
        return tarfile_to_samples(handler=handler)
    return cached_tarfile_to_samples(
        handler=handler,
        cache_size=cache_size,
        cache_dir=cache_dir,
        verbose=verbose,
        url_to_name=url_to_name,
        always=always,
    )
