"""webdataset's ``DirectoryShardList``: shards taken from a directory that something else fills.

A producer drops shards into a directory; each consumer process claims one by renaming it to
``NAME._PID_`` (a rename is atomic, so two consumers never claim the same shard), reads it,
and then recycles it: deletes it (``mode="unlink"``), keeps it as ``NAME._done_``
(``"keep"``), or puts it back under its first name for anyone to read again (``"resample"``).
Shards claimed by processes that have died are recycled too. It is a work queue, not an epoch:
which consumer reads which shard depends on timing, so it is not resumable.
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator

from wdsx.core.utilities import glob_with_braces

_CLAIMED = re.compile(r"^(.*)\._(\d+)_$")


def check_pid_is_running(pid: int) -> bool:
    """Whether a process with id ``pid`` exists (signal 0 reaches it)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def without_last_extension(fname: str) -> str:
    """``fname`` without its last ``.suffix``."""
    return re.sub(r"\.[^.]*$", "", fname)


def get_pid_from_filename(fname: str) -> int | None:
    """The process id in a claimed shard's name ``NAME._PID_``; None for other names."""
    match = _CLAIMED.match(fname)
    return int(match.group(2)) if match else None


class DirectoryShardList:
    """``{"url": path}`` for shards claimed one at a time from the directory ``path`` (ending
    in ``/``), waiting ``poll`` seconds when it is empty (``poll=None``: stop instead), until
    ``timeout`` seconds have passed. ``select``: ``"random"`` or ``"oldest"`` (by mtime).
    ``pattern`` may use braces (``*.{tar,tgz}``)."""

    def __init__(
        self,
        path: str,
        pattern: str = "*.{tar,tgz,tar.tgz}",
        poll: float | None = 1,
        timeout: float = 1e12,
        mode: str = "resample",
        select: str = "random",
        fate: object = None,
    ):
        if not path.endswith("/"):
            raise ValueError(f"{path}: a DirectoryShardList path ends with '/'")
        if not os.path.isdir(path):
            raise ValueError(f"{path}: not a directory")
        if select not in ("random", "oldest"):
            raise ValueError(f"unknown selection strategy {select}")
        self.path = path
        self.poll = poll
        self.pattern = pattern
        self.mode = mode
        self.select = select
        self.fate = fate
        self.timeout = timeout

    def recycle(self, activename: str) -> None:
        """Delete, keep or put back a shard this process has read (see ``mode``)."""
        if self.mode == "unlink":
            os.unlink(activename)
        elif self.mode == "keep":
            os.rename(activename, without_last_extension(activename) + "._done_")
        elif self.mode == "resample":
            os.rename(activename, without_last_extension(activename))

    def cleanup_files_without_processes(self) -> None:
        """Recycle the shards claimed by processes that no longer run."""
        for fname in glob_with_braces(os.path.join(self.path, "*._*_")):
            pid = get_pid_from_filename(fname)
            if pid is not None and not check_pid_is_running(pid):
                self.recycle(fname)

    def _pick(self, candidates: list[str]) -> str:
        if self.select == "oldest":
            return min(candidates, key=lambda name: os.stat(name).st_mtime)
        return random.choice(candidates)

    def __iter__(self) -> Iterator[dict[str, str]]:
        start = time.time()
        while time.time() - start < self.timeout:
            candidates = sorted(glob_with_braces(self.path + self.pattern))
            if not candidates:
                if self.poll is None:
                    return
                time.sleep(self.poll)
                continue
            candidate = self._pick(candidates)
            activename = f"{candidate}._{os.getpid()}_"
            try:
                os.rename(candidate, activename)
            except FileNotFoundError:  # another consumer claimed it first
                continue
            yield {"url": activename}
            self.recycle(activename)
            self.cleanup_files_without_processes()
