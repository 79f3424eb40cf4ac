"""webdataset's file cache: shards copied whole into a directory under names a program chooses.

wdsx's own cache (:mod:`wdsx.sources.cache`, ``cache_dir=`` on WebDataset) names entries by a
digest of the URL and lets readers follow a download as it grows. Programs written for
webdataset build its cache by hand instead: ``FileCache`` as a pipeline stage, cache names from
``url_to_cache_name``, ``LRUCleanup`` to bound a directory. This module gives them those
objects with webdataset's behaviour, downloading through wdsx's sources (ranged retries that
resume, every scheme wdsx reads, openers set in ``gopen_schemes``), one download per entry
even when DataLoader workers ask for the same shard at once.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdsx.core.errors import Handler, reraise_exception
from wdsx.core.utilities import pipe_cleaner
from wdsx.sources import local_path
from wdsx.sources.cache import try_lock

log = logging.getLogger("wdsx")

_PATH_SCHEMES = ("", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais")
"""Schemes whose URL path names a cache entry; others are named by the quoted URL."""
_QUOTED_LENGTH = 128


def default_cache_dir() -> str:
    """``WDS_CACHE``, else ``./_cache``: where webdataset's caches go unless told otherwise."""
    return os.environ.get("WDS_CACHE", "./_cache")


def default_cache_size() -> float:
    """``WDS_CACHE_SIZE`` in bytes, else 1e18 (no bound in practice)."""
    return float(os.environ.get("WDS_CACHE_SIZE", "1e18"))


def verbose_cache() -> int:
    """``WDS_VERBOSE_CACHE``: log every download and opening at INFO level when non-zero."""
    return int(os.environ.get("WDS_VERBOSE_CACHE", "0"))


def islocal(url: str) -> bool:
    """Whether ``url`` is a local path or ``file:`` URL (webdataset's test, by URL syntax)."""
    return urllib.parse.urlparse(url).scheme in ("", "file")


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """webdataset's cache name of ``url``: the last ``ndir + 1`` components of its path for
    local, HTTP, FTP, ``gs``, ``s3`` and ``ais`` URLs; otherwise the whole URL quoted (``/``
    and ``:`` included), keeping its last 128 characters."""
    if not isinstance(url, str):
        raise TypeError(f"url_to_cache_name needs a str, got {type(url).__name__}")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in _PATH_SCHEMES:
        parts = parsed.path.lstrip("/").split("/")
        return "/".join(parts[-1 - ndir :])
    return urllib.parse.quote(url, safe="_+{}*,-")[-_QUOTED_LENGTH:]


def magic_filetype(fname: str) -> str:
    """``"NAME: gzip compressed data"``, ``"NAME: POSIX tar archive"`` or ``"NAME: data"``,
    from the file's first 512 bytes (the answers of the ``file`` command webdataset checks)."""
    with open(fname, "rb") as stream:
        header = stream.read(512)
    if header[:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def get_filetype(fname: str) -> str:
    """What the ``file`` command says about ``fname`` (:func:`magic_filetype` where it is not
    installed)."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    if shutil.which("file") is None:
        return magic_filetype(fname)
    return subprocess.run(["file", fname], stdout=subprocess.PIPE, text=True, check=True).stdout


def check_tar_format(fname: str) -> bool:
    """Whether ``fname`` starts like a tar archive or a gzip stream."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    kind = magic_filetype(fname).lower()
    return "tar archive" in kind or "gzip compressed" in kind


def _files_under(directory: str) -> list[str]:
    return [os.path.join(where, name) for where, _, names in os.walk(directory) for name in names]


def lru_cleanup(
    cache_dir: str, cache_size: float, keyfn: Callable[[str], float] = os.path.getctime, verbose: bool = False
) -> None:
    """Delete files under ``cache_dir``, smallest ``keyfn`` first (oldest), until they total at
    most ``cache_size`` bytes. Files another process removes meanwhile are ignored."""
    if not os.path.exists(cache_dir):
        return
    try:
        files = _files_under(cache_dir)
        total = sum(os.path.getsize(name) for name in files)
        for name in sorted(files, key=keyfn):
            if total <= cache_size:
                break
            size = os.path.getsize(name)
            if verbose or verbose_cache():
                log.info("cache: deleting %s", name)
            os.remove(name)
            total -= size
    except OSError:
        pass


class LRUCleanup:
    """Keeps a directory within ``cache_size`` bytes with :func:`lru_cleanup`, at most once
    every ``interval`` seconds (None: every call)."""

    def __init__(
        self,
        cache_dir: str | None = None,
        cache_size: float = int(1e12),
        keyfn: Callable[[str], float] = os.path.getctime,
        verbose: bool = False,
        interval: float | None = 30,
    ):
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.keyfn = keyfn
        self.verbose = verbose
        self.interval = interval
        self.last_run = 0.0

    def set_cache_dir(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir

    def cleanup(self) -> None:
        """Delete least recently created files if the directory is over its size."""
        if self.cache_dir is None or not os.path.exists(self.cache_dir):
            return
        if self.interval is not None and time.time() - self.last_run < self.interval:
            return
        lru_cleanup(self.cache_dir, self.cache_size, self.keyfn, self.verbose)
        self.last_run = time.time()


def download(url: str, dest: str, chunk_size: int = 1024**2, verbose: bool = False) -> None:
    """Copy ``url`` to ``dest`` through wdsx's sources; ``dest`` appears only when complete."""
    from wdsx.sources.schemes import gopen

    if verbose or verbose_cache():
        log.info("cache: downloading %s to %s", url, dest)
    temporary = f"{dest}.temp{os.getpid()}"
    try:
        with gopen(url, "rb") as stream, open(temporary, "wb") as out:
            shutil.copyfileobj(stream, out, chunk_size)
        os.replace(temporary, dest)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


def download_once(url: str, dest: str, verbose: bool = False) -> None:
    """:func:`download` unless ``dest`` exists; processes that want the same ``dest`` at once
    wait for the one that downloads it (a lock file next to it)."""
    if os.path.exists(dest):
        return
    lock_name = dest + ".lock"
    while True:
        lock = try_lock(lock_name)
        if lock is not None:
            break
        _wait_for_lock(lock_name)
    try:
        if not os.path.exists(dest):
            download(url, dest, verbose=verbose)
    finally:
        os.close(lock)
        try:
            os.remove(lock_name)
        except FileNotFoundError:
            pass


def _wait_for_lock(lock_name: str) -> None:
    """Block until whoever holds ``lock_name`` releases it."""
    import fcntl

    try:
        fd = os.open(lock_name, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _url_of(item: Any) -> str:
    return item["url"] if isinstance(item, dict) else item


class StreamingOpen:
    """A pipeline stage: each URL (or ``{"url": ...}``) becomes ``{"url", "stream"}`` (plus
    ``"local_path"`` for local files), opened with :func:`wdsx.gopen`; ``handler`` decides
    what an error to open one does."""

    def __init__(self, verbose: bool = False, handler: Handler = reraise_exception):
        self.verbose = verbose
        self.handler = handler

    def __call__(self, urls: Iterable[Any]) -> Iterator[dict[str, Any]]:
        from wdsx.sources.schemes import gopen

        for item in urls:
            url = _url_of(item)
            try:
                path = local_path(url)
                if path is not None:
                    yield {"url": url, "stream": open(path, "rb"), "local_path": path}  # noqa: SIM115
                else:
                    yield {"url": url, "stream": gopen(url, "rb")}
            except Exception as exn:
                if self.handler(exn):
                    continue
                break


class FileCache:
    """A pipeline stage: each URL (or ``{"url": ...}``) becomes ``{"url", "stream",
    "local_path"}`` read from a copy under ``cache_dir`` named ``url_to_name(url)``, downloaded
    first if missing. Local URLs are read in place. ``validator`` checks a new copy (a bad one
    is deleted and raises ValueError); ``cache_size > 0`` bounds the directory with
    :class:`LRUCleanup`. When ``handler`` returns True for an error, the URL is skipped (wdsx's
    sources have already retried the download, resuming where it stopped)."""

    def __init__(
        self,
        cache_dir: str | None = None,
        *,
        url_to_name: Callable[[str], str] = url_to_cache_name,
        verbose: bool = False,
        validator: Callable[[str], bool] | None = check_tar_format,
        handler: Handler = reraise_exception,
        cache_size: int = -1,
        cache_cleanup_interval: int = 30,
    ):
        self.url_to_name = url_to_name
        self.validator = validator
        self.handler = handler
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self.verbose = verbose
        self.cleaner = (
            LRUCleanup(self.cache_dir, cache_size, verbose=verbose, interval=cache_cleanup_interval)
            if cache_size > 0
            else None
        )

    def get_file(self, url: str) -> str:
        """The local path of ``url``'s copy, downloading it first if needed."""
        if islocal(url):
            return urllib.parse.urlparse(url).path
        name = self.url_to_name(url)
        if "/" in name:
            raise ValueError(f"bad cache name {name} for {url}")
        os.makedirs(self.cache_dir, exist_ok=True)
        dest = os.path.join(self.cache_dir, name)
        if not os.path.exists(dest):
            if self.cleaner is not None:
                self.cleaner.cleanup()
            download_once(url, dest, verbose=self.verbose)
            if self.validator is not None and not self.validator(dest):
                kind = get_filetype(dest)
                with open(dest, "rb") as stream:
                    start = stream.read(200)
                os.remove(dest)
                raise ValueError(f"{dest} ({url}) is not a tar archive, but a {kind}, contains {start!r}")
        return dest

    def __call__(self, urls: Iterable[Any]) -> Iterator[dict[str, Any]]:
        for item in urls:
            url = _url_of(item)
            try:
                dest = self.get_file(url)
                stream = open(dest, "rb")  # noqa: SIM115 - the reader closes it
            except Exception as exn:
                if self.handler(exn):
                    continue
                break
            yield {"url": url, "stream": stream, "local_path": dest}


def get_file_cached(
    spec: str,
    cache_size: float = -1,
    cache_dir: str | None = None,
    url_to_name: Callable[[str], str] = pipe_cleaner,
    verbose: bool = False,
) -> str:
    """webdataset 0.2's cache lookup: the copy of ``spec`` under ``cache_dir``, at the path of
    ``url_to_name(spec)`` (its directory flattened with ``_``), downloaded if missing after
    trimming the directory to ``cache_size`` bytes (-1: ``WDS_CACHE_SIZE``)."""
    cache_size = default_cache_size() if cache_size == -1 else cache_size
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    directory, filename = os.path.split(urllib.parse.urlparse(url_to_name(spec)).path)
    directory = re.sub(r"[:/|;]", "_", directory.lstrip("/"))
    os.makedirs(os.path.join(cache_dir, directory), exist_ok=True)
    dest = os.path.join(cache_dir, directory, filename)
    if not os.path.exists(dest):
        lru_cleanup(cache_dir, cache_size, verbose=verbose)
        download_once(spec, dest, verbose=verbose)
    return dest
