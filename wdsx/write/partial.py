"""Local shards are written under a hidden temporary name and renamed when complete; a writer
that is killed leaves that ``.partial`` file behind. This module names those files so that a
later writer can tell a dead writer's leftovers from a live writer's work, and removes only
the former.

A partial file is ``.<shard name>.<host>.<pid>.<random>.partial`` and its writer holds an
exclusive ``flock`` on it until it is renamed or discarded. Another writer about to write the
same shard removes a partial file only when nobody holds its lock and:

- it was written on this host by a process that no longer exists, or
- it was written on another host (a shared filesystem) and has not changed for an hour.

A partial file whose lock cannot be tested (a filesystem without locks) is removed only in the
first case; one that does not follow this naming (another tool's) is never touched.

A writer that fails (a full disk at any write, at the flush or at the rename) removes its
partial file before the error reaches the caller.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import logging
import os
import re
import secrets
import socket
import time

from wdsx.read.index import SUFFIX as INDEX_SUFFIX
from wdsx.sources import Sink, SourceOptions, local_path, open_sink, rewrite_url

log = logging.getLogger("wdsx")

OTHER_HOST_GRACE = 3600.0
"""Seconds a partial file from another host must have been left unchanged before it counts as
abandoned (its lock says nobody holds it; the grace covers the instant between a writer
creating the file and locking it)."""

_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:64] or "host"
_PARTIAL = re.compile(r"\.(?P<host>[A-Za-z0-9-]+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.partial$")


def partial_name(path: str) -> str:
    """A fresh name for the partial file of the shard at ``path``, in the same directory."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.{_HOST}.{os.getpid()}.{secrets.token_hex(4)}.partial")


class PartialFileSink(Sink):
    """A local shard written to a locked partial file, renamed into place on commit."""

    def __init__(self, url: str, path: str):
        self.url = url
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._temp = partial_name(path)
        fd = os.open(self._temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _lock(fd, blocking=True)
        except OSError as exn:  # a filesystem without locks: host and pid still say who writes
            log.debug("cannot lock %s: %s", self._temp, exn)
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes | bytearray | memoryview) -> int:
        return self._file.write(data)

    def commit(self) -> None:
        if self._file.closed:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            os.chmod(self._temp, 0o644)
            # an offset index beside the shard describes the file this one replaces
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path + INDEX_SUFFIX)
            os.replace(self._temp, self.path)  # renamed while still locked: no cleaner can interfere
        except BaseException:
            self.abort()
            raise
        self._file.close()

    def abort(self) -> None:
        # Closing flushes what is buffered, which fails again on a full disk; the descriptor is
        # closed all the same, and the file goes.
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


def _lock(fd: int, blocking: bool) -> None:
    fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: a zombie (killed, not yet reaped, as happens under
    a container's init that reaps nobody) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state not in (b"Z", b"X")


def _lock_free(path: str) -> bool | None:
    """Whether nobody holds the partial file's lock; None when that cannot be told."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        _lock(fd, blocking=False)
        return True
    except OSError as exn:
        return False if exn.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) else None
    finally:
        os.close(fd)


def is_abandoned(path: str, now: float | None = None) -> bool:
    """Whether the partial file at ``path`` was left by a writer that is gone (see the module's
    docstring for the rules)."""
    match = _PARTIAL.search(os.path.basename(path))
    if match is None:
        return False
    same_host, pid = match.group("host") == _HOST, int(match.group("pid"))
    free = _lock_free(path)
    if free is False:
        return False
    if same_host:
        return not _pid_alive(pid)
    if free is None:
        return False
    try:
        idle = (time.time() if now is None else now) - os.stat(path).st_mtime
    except OSError:
        return False
    return idle > OTHER_HOST_GRACE


def remove_abandoned_partials(path: str) -> list[str]:
    """Remove what killed writers left of the shard at ``path``; returns the removed paths."""
    directory, base = os.path.split(os.path.abspath(path))
    removed = []
    for candidate in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(base)}.*.partial")):
        if is_abandoned(candidate):
            try:
                os.unlink(candidate)
            except FileNotFoundError:
                continue
            log.info("removed %s, left by a writer that was killed", candidate)
            removed.append(candidate)
    return removed


def write_whole(url: str, data: bytes, options: SourceOptions | None = None) -> None:
    """Write the small file ``url`` (a manifest, a record) through :func:`open_shard_sink`: it
    appears complete or not at all, and a failure leaves nothing behind."""
    sink = open_shard_sink(url, options)
    try:
        sink.write(data)
        sink.commit()
    except BaseException:
        sink.abort()
        raise


def open_shard_sink(url: str, options: SourceOptions | None = None) -> Sink:
    """Open ``url`` for writing one shard: a local shard goes to a locked partial file (after
    removing what killed writers left of it), any other through
    :func:`~wdsx.sources.open_sink`."""
    path = local_path(rewrite_url(url))
    if path is None:
        return open_sink(url, options)
    remove_abandoned_partials(path)
    return PartialFileSink(url, path)
