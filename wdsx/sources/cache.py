"""Local copies of remote shards: readable while they download, downloaded once, bounded in size.

Each remote shard has three names under ``cache_dir``, all starting with a digest of the full
URL (and of the expected sha256, when one is given) followed by the URL's basename, so shards
with the same basename in different buckets never collide:

- ``NAME``: the complete copy. Opening it at an offset is a local seek.
- ``NAME.part``: the copy being downloaded. Readers follow it as it grows instead of waiting
  for the whole shard.
- ``NAME.lock``: held with ``flock`` by the one process downloading the shard, so DataLoader
  workers that want the same shard at once download it once; the others follow the ``.part``.

A download is renamed to ``NAME`` only when complete (and, with an expected sha256, verified),
after evicting the least recently opened copies so the cache stays within ``cache_size``. With
the shard's recorded size, a remote stream that goes on past it fails the download, so an
endless reply costs at most that size on disk.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

from wdsx.core.errors import SourceError
from wdsx.sources.base import Source, SourceOptions
from wdsx.sources.local import LocalSource
from wdsx.sources.sized import SizedSource

log = logging.getLogger("wdsx")

Opener = Callable[[str, int, SourceOptions], Source]

PART = ".part"
LOCK = ".lock"
PLACING = ".placing.lock"
"""The file whose lock a download holds while it makes room and moves its copy in."""
_ENTRY = re.compile(r"[0-9a-f]{20}-[^/]+")
_OPEN_ROUNDS = 1000
"""Bound on attempts to open a cache entry that keeps changing under us (evicted, renamed...)."""
_POLL_SECONDS = (0.001, 0.02)
"""First and longest wait of a reader that has caught up with a download."""

_active: dict[str, _Download] = {}
"""Downloads running in this process, by final cache path."""
_active_lock = threading.Lock()
_placing_fds: set[int] = set()
"""Descriptors of the placing lock that download threads hold (see :func:`_placing`)."""


def cache_path(cache_dir: str, url: str, sha256: str | None = None) -> str:
    """Where the copy of ``url`` lives: a digest of the URL, then a readable basename (the
    last part of its path: a query may hold a signature, which would end up in logs)."""
    digest = hashlib.sha256(f"{url}\0{sha256 or ''}".encode()).hexdigest()[:20]
    path = url.partition("#")[0].partition("?")[0]
    basename = re.sub(r"[^A-Za-z0-9._-]+", "_", path.rstrip("/").rsplit("/", 1)[-1]).strip("._-")[:80]
    return os.path.join(cache_dir, f"{digest}-{basename or 'shard'}")


def open_cached(
    url: str,
    offset: int,
    options: SourceOptions,
    opener: Opener,
    sha256: str | None = None,
    size: int | None = None,
) -> Source:
    """Open ``url`` at ``offset`` from the cache, downloading it there first if needed.

    ``opener`` opens the remote shard (``opener(url, 0, options)``) when this process is the
    one that downloads it. With ``sha256``, a download whose digest differs is deleted and
    reading it raises :class:`SourceError`. With ``size`` (the recorded size), a download whose
    stream goes on past it is deleted and reading past ``size`` raises :class:`SourceError`.
    """
    assert options.cache_dir is not None
    os.makedirs(options.cache_dir, exist_ok=True)
    path = cache_path(options.cache_dir, url, sha256)
    deadline = time.monotonic() + options.timeout
    for _ in range(_OPEN_ROUNDS):
        source = _open_complete(url, path, offset)
        if source is not None:
            return source
        lock = try_lock(path + LOCK)
        if lock is not None:
            if os.path.exists(path):
                os.close(lock)
                continue
            download = _Download(url, path, lock, options, opener, sha256, size)
            source = FollowingSource(
                url, path, download.reader(), offset, options, opener, sha256, size, download
            )
            download.start()
            return source
        source = _follow(url, path, offset, options, opener, sha256, size)
        if source is not None:
            return source
        if time.monotonic() > deadline:
            break
        time.sleep(_POLL_SECONDS[0])
    raise SourceError(url, f"cache entry {path} kept changing while opening it at byte {offset}")


def _open_complete(url: str, path: str, offset: int) -> Source | None:
    """The complete copy at ``offset``, marked as just used; None when there is none."""
    try:
        os.utime(path)
        return LocalSource(url, path, offset)
    except FileNotFoundError:
        return None
    except SourceError as exn:
        if isinstance(exn.__cause__, FileNotFoundError):
            return None
        raise


def _follow(
    url: str,
    path: str,
    offset: int,
    options: SourceOptions,
    opener: Opener,
    sha256: str | None,
    size: int | None,
) -> Source | None:
    """Read the download another thread or process is writing; None when there is none yet."""
    try:
        fd = os.open(path + PART, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with _active_lock:
        download = _active.get(path)
    if download is not None and download.inode != os.fstat(fd).st_ino:
        download = None
    return FollowingSource(url, path, fd, offset, options, opener, sha256, size, download)


def try_lock(path: str) -> int | None:
    """An ``flock``-ed descriptor of the lock file ``path``, or None if another holder has it.

    A lock file can be deleted by eviction while someone waits on it; holding a lock on a
    deleted file means nothing, so the lock counts only if ``path`` still names that file.
    """
    for _ in range(_OPEN_ROUNDS):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)
    return None


def _lock_is_held(path: str) -> bool:
    """Whether some process holds the lock file ``path`` (someone is downloading)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def evict(cache_dir: str, limit: int, reserve: int = 0) -> None:
    """Delete least recently opened copies until they total at most ``limit - reserve`` bytes.

    Also deletes ``.part`` files that no process is downloading any more (left by a crash).
    A reader that already has an evicted copy open keeps reading it.
    """
    if limit < 0:
        return
    copies = []
    for name in os.listdir(cache_dir):
        path = os.path.join(cache_dir, name)
        if name.endswith(PART) and not _lock_is_held(path[: -len(PART)] + LOCK):
            _remove(path)
        elif _ENTRY.fullmatch(name) and not name.endswith((PART, LOCK)):
            try:
                stat = os.stat(path)
            except FileNotFoundError:
                continue
            copies.append((stat.st_atime, stat.st_size, path))
    total = sum(size for _, size, _ in copies) + reserve
    for _, size, path in sorted(copies):
        if total <= limit:
            break
        log.debug("cache: evicting %s (%d bytes)", path, size)
        _remove(path)
        lock = try_lock(path + LOCK)
        if lock is not None:
            _remove(path + LOCK)
            os.close(lock)
        total -= size


@contextlib.contextmanager
def _placing(cache_dir: str) -> Iterator[None]:
    """Hold the cache's lock on placing copies (for every thread and process using it). The
    descriptor holding it is listed while held: a child forked meanwhile closes its copy,
    which would otherwise keep the lock held for as long as the child lives."""
    fd = os.open(os.path.join(cache_dir, PLACING), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    with _active_lock:
        _placing_fds.add(fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)  # (a copy forked before it was listed must not keep it)
        with _active_lock:
            _placing_fds.discard(fd)
        os.close(fd)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Download:
    """Copies one remote shard into ``NAME.part`` in a background thread, then renames it.

    Holds the shard's lock from start to finish; the remote stream is opened before
    :meth:`start`, so errors such as a missing object surface in the caller. With ``size``, the
    stream may deliver that many bytes and no more (:class:`~wdsx.sources.sized.SizedSource`).
    """

    def __init__(
        self,
        url: str,
        path: str,
        lock: int,
        options: SourceOptions,
        opener: Opener,
        sha256: str | None,
        size: int | None,
    ):
        self.url = url
        self.path = path
        self.error: BaseException | None = None
        self.done = False
        self._lock = lock
        self._options = options
        self._sha256 = sha256
        self._file = -1
        try:
            _remove(path + PART)
            self._file = os.open(path + PART, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            self.inode = os.fstat(self._file).st_ino
            source = opener(url, 0, options)
            self._source = source if size is None else SizedSource(source, 0, size)
        except BaseException:
            if self._file >= 0:
                _remove(path + PART)
            self._release()
            raise

    def start(self) -> None:
        with _active_lock:
            _active[self.path] = self
        name = f"wdsx-cache {os.path.basename(self.path)}"
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def reader(self) -> int:
        """A new read-only descriptor of the file being downloaded."""
        return os.open(self.path + PART, os.O_RDONLY | os.O_CLOEXEC)

    def _run(self) -> None:
        try:
            size = self._copy()
            # one download at a time makes room and moves in: two that made room side by side
            # would each leave room for itself only, and together exceed the bound
            with _placing(os.path.dirname(self.path)):
                evict(os.path.dirname(self.path), self._options.cache_size, reserve=size)
                os.rename(self.path + PART, self.path)
            self.done = True
        except BaseException as exn:
            _remove(self.path + PART)  # first: a reader that sees the error finds no partial copy
            self.error = exn
        finally:
            self._source.close()
            self._release()

    def _copy(self) -> int:
        digest = hashlib.sha256() if self._sha256 else None
        size = 0
        while True:
            data = self._source.read(self._options.chunk)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(self._file, view) :]
            if digest is not None:
                digest.update(data)
            size += len(data)
        os.fsync(self._file)
        if digest is not None and digest.hexdigest() != (self._sha256 or "").lower():
            raise SourceError(
                self.url,
                f"sha256 mismatch: expected {self._sha256}, downloaded {size} bytes with sha256 "
                f"{digest.hexdigest()}; the cached copy was deleted",
            )
        return size

    def _release(self) -> None:
        with _active_lock:
            if _active.get(self.path) is self:
                del _active[self.path]
        if self._file >= 0:
            os.close(self._file)
            self._file = -1
        os.close(self._lock)


def _forget_downloads_after_fork() -> None:
    """A forked child has no download threads; drop its copies of their descriptors."""
    global _active_lock
    _active_lock = threading.Lock()
    for download in _active.values():
        if download._file >= 0:
            os.close(download._file)
        os.close(download._lock)
    _active.clear()
    for fd in _placing_fds:
        os.close(fd)
    _placing_fds.clear()


os.register_at_fork(after_in_child=_forget_downloads_after_fork)


class FollowingSource(Source):
    """Reads a shard's ``.part`` file while it is being downloaded, waiting when it catches up.

    The end of the file is the end of the shard only once the download has been renamed into
    place. If the download stops without finishing (its process died), reading continues from
    a fresh :func:`open_cached` at the same byte.
    """

    def __init__(
        self,
        url: str,
        path: str,
        fd: int,
        offset: int,
        options: SourceOptions,
        opener: Opener,
        sha256: str | None,
        size: int | None,
        download: _Download | None,
    ):
        self.url = url
        self.local_path = path
        self.position = offset
        self._fd = fd
        self._inode = os.fstat(fd).st_ino
        self._options = options
        self._reopen = (opener, sha256, size)
        self._download = download
        self._replacement: Source | None = None

    def read(self, n: int) -> bytes:
        if self._replacement is not None:
            return self._replacement.read(n)
        if self._fd < 0:
            raise ValueError(f"{self.url}: read from a closed source")
        waited = 0
        stalled_since = time.monotonic()
        size = os.fstat(self._fd).st_size
        while True:
            data = os.pread(self._fd, min(n, self._options.chunk), self.position)
            if data or n <= 0:
                self.position += len(data)
                return data
            state = self._download_state()
            if state == "complete":
                data = os.pread(self._fd, min(n, self._options.chunk), self.position)
                self.position += len(data)
                return data
            if state == "stopped":
                return self._continue_elsewhere(n)
            grown = os.fstat(self._fd).st_size
            if grown != size:
                size, waited, stalled_since = grown, 0, time.monotonic()
            elif time.monotonic() - stalled_since > self._stall_limit():
                raise SourceError(
                    self.url,
                    f"cache download {self._part_name()} made no progress for {self._stall_limit():.0f}s "
                    f"at byte {self.position}",
                )
            time.sleep(min(_POLL_SECONDS[0] * 2**waited, _POLL_SECONDS[1]))
            waited += 1

    def _stall_limit(self) -> float:
        """Long enough for the downloader's own timeouts and retries to run their course."""
        return self._options.timeout * (self._options.retries + 2)

    def _part_name(self) -> str:
        return (self.local_path or "") + PART

    def _download_state(self) -> str:
        """``"complete"``, ``"running"``, or ``"stopped"`` (failed, or its process died)."""
        download = self._download
        if download is not None:
            if download.error is not None:
                if isinstance(download.error, SourceError):
                    raise SourceError(self.url, download.error.reason) from download.error
                raise SourceError(self.url, f"caching failed at byte {self.position}: {download.error!r}")
            return "complete" if download.done else "running"
        path = self.local_path or ""
        for name, state in ((path, "complete"), (path + PART, "running")):
            try:
                if os.stat(name).st_ino == self._inode:
                    return state if state == "complete" or _lock_is_held(path + LOCK) else "stopped"
            except FileNotFoundError:
                pass
        return "stopped"

    def _continue_elsewhere(self, n: int) -> bytes:
        log.info("%s: the download being followed stopped at byte %d; reopening", self.url, self.position)
        opener, sha256, size = self._reopen
        self.close()
        self._replacement = open_cached(self.url, self.position, self._options, opener, sha256, size)
        return self._replacement.read(n)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._replacement is not None:
            self._replacement.close()
