"""``pipe:CMD`` shards, as in webdataset: a shell command whose standard output is the shard.

Stopping early (``close()``, garbage collection, a generator closed mid-shard) closes the pipe
and reaps the command: no orphaned ``aws``/``curl`` processes, no zombies, no leaked pipe
descriptors. The command runs in its own process group, so one that does not exit when its
output is closed gets SIGTERM, then SIGKILL, with everything it started (the shell is spared
the first SIGTERM so that it reaps its children instead of orphaning them). Exit status 141
(the shell's report of SIGPIPE) is not an error; any other non-zero status is, once the stream
has ended. ``WDS_SECURE=1`` or ``SourceOptions(allow_pipe=False)`` refuses ``pipe:`` URLs.

A command whose output stalls (less than ``SourceOptions.min_rate`` bytes per second over the
stall window, :mod:`wdsx.sources.stall`) fails with an error naming the byte it stalled at: it
is not run again, since a command cannot be asked for its output from a byte on, and running
it twice may do twice what it does.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import IO

from wdsx.core.env import secure_mode
from wdsx.core.errors import RefusedError, SourceError
from wdsx.sources import reaper
from wdsx.sources.base import Sink, SourceOptions
from wdsx.sources.stream import PolledStream, close_quietly

SECURE_MODE_REFUSAL = "gopen_pipe: unsafe_gopen is False, cannot open pipe URLs (secure mode, WDS_SECURE=1)"
"""Why secure mode refuses a ``pipe:`` URL, in webdataset's words first (code matches them)."""

log = logging.getLogger("wdsx")

_SIGPIPE_STATUSES = frozenset((141, -signal.SIGPIPE))
_SHELL = "/bin/sh"
"""What ``subprocess.Popen(shell=True)`` runs commands with."""
_GRACE_SECONDS = 1.0
"""How long a stopped command may take to exit before it gets SIGTERM, then SIGKILL."""


def _start(
    url: str,
    options: SourceOptions,
    stdin: int | None = None,
    stdout: int | None = None,
    bufsize: int | None = None,
) -> subprocess.Popen[bytes]:
    """Run the command of ``url``; its pipe is buffered by ``bufsize`` bytes (default
    ``options.chunk``; 0 for none)."""
    if secure_mode():
        raise RefusedError(url, f"pipe: URLs are disabled: {SECURE_MODE_REFUSAL}")
    if not options.allow_pipe:
        raise RefusedError(url, "pipe: URLs are disabled (SourceOptions(allow_pipe=False))")
    command = url[len("pipe:") :]
    try:
        process = subprocess.Popen(
            command,
            shell=True,
            bufsize=options.chunk if bufsize is None else bufsize,
            start_new_session=True,
            stdin=stdin,
            stdout=stdout,
        )
    except OSError as exn:
        raise SourceError(url, f"cannot start command {command!r}: {exn}") from exn
    reaper.watch(process.pid)  # its group (it leads one) dies with this process at the latest
    return process


def _wait(process: subprocess.Popen, timeout: float | None = None) -> int:
    """Wait for the command to exit (``subprocess.TimeoutExpired`` after ``timeout``), and
    take it off the list of groups the watcher kills when this process dies."""
    status = process.wait(timeout=timeout)
    reaper.forget(process.pid)
    return status


def _reap(process: subprocess.Popen, patient: bool = True) -> None:
    """Wait for the command to exit, stopping it with signals if it lingers.

    A command whose output pipe was closed exits on its own at its next write (SIGPIPE), and the
    shell reaps the pipeline it started, so a ``patient`` stop first just waits. Then the
    processes the shell started get SIGTERM while the shell itself is spared, so that it is
    still there to reap them; last, the whole group gets SIGTERM, then SIGKILL.
    """
    if patient and _exited_within(process, _GRACE_SECONDS):
        return
    deadline = time.monotonic() + _GRACE_SECONDS
    while time.monotonic() < deadline:
        _terminate_all_but_the_shell(process)
        if _exited_within(process, 0.05):
            return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        if _exited_within(process, _GRACE_SECONDS):
            return
    _wait(process)


def _exited_within(process: subprocess.Popen, seconds: float) -> bool:
    try:
        _wait(process, seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def _terminate_all_but_the_shell(process: subprocess.Popen) -> None:
    """SIGTERM every live process of the command's group except a shell that leads it."""
    members = _group_members(process.pid)
    if members is None:
        members = [process.pid]
    for pid in members:
        if pid == process.pid and _runs_the_shell(pid):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _runs_the_shell(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == os.path.realpath(_SHELL)
    except OSError:
        return False


def _group_members(group: int) -> list[int] | None:
    """Live processes of a process group, read from ``/proc``; None where there is no ``/proc``."""
    try:
        entries = os.listdir("/proc")
    except FileNotFoundError:
        return None
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z" and int(fields[2]) == group:
            members.append(int(entry))
    return members


def _check_status(url: str, process: subprocess.Popen, status: int) -> None:
    if status != 0 and status not in _SIGPIPE_STATUSES:
        raise SourceError(url, f"command {process.args!r} exited with status {status}")


class PipeSource(PolledStream):
    """The standard output of ``pipe:CMD``; starting at an offset reads and discards up to it.

    The output is read unbuffered, each read taking what the pipe holds once it holds anything,
    so that the time the command keeps it waiting can be measured."""

    def __init__(self, url: str, offset: int = 0, options: SourceOptions | None = None):
        options = options or SourceOptions()
        self.local_path = None
        self._process = _start(url, options, stdout=subprocess.PIPE, bufsize=0)
        assert self._process.stdout is not None
        self._start(url, self._process.stdout, offset, options)

    def _finish(self) -> None:
        """At the end of the stream: wait for the command and check how it exited."""
        self._stream.close()
        try:
            status = _wait(self._process, self._options.timeout)
        except subprocess.TimeoutExpired as exn:
            _reap(self._process)
            raise SourceError(
                self.url, f"command still running {self._options.timeout}s after its output ended"
            ) from exn
        _check_status(self.url, self._process, status)

    def _release(self) -> None:
        _reap(self._process)

    def interrupt(self) -> None:
        """Stop the command (its whole group): the read waiting for its output then ends."""
        if self._process.poll() is not None:  # it has ended, and is reaped now: its number is free
            reaper.forget(self._process.pid)
            return
        try:
            os.killpg(self._process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


class PipeSink(Sink):
    """Writes a shard to the standard input of ``pipe:CMD``; commit waits for it to succeed."""

    def __init__(self, url: str, options: SourceOptions | None = None):
        self.url = url
        self._process = _start(url, options or SourceOptions(), stdin=subprocess.PIPE)
        assert self._process.stdin is not None
        self._stdin: IO[bytes] = self._process.stdin
        self._finished = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        try:
            return self._stdin.write(data)
        except BrokenPipeError as exn:
            status = _wait(self._process)
            self._finished = True
            raise SourceError(
                self.url, f"command {self._process.args!r} exited with status {status}"
            ) from exn

    def commit(self) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            self._stdin.close()
        except BrokenPipeError:
            pass
        _check_status(self.url, self._process, _wait(self._process))

    def abort(self) -> None:
        if not self._finished:
            self._finished = True
            _reap(self._process, patient=False)
            close_quietly(self._stdin)
