"""``pipe:`` commands that never outlive the process that reads them.

A ``pipe:`` command runs in a process group of its own, so that it can be stopped with all it
started (:mod:`wdsx.sources.pipe`). A process that stops reading reaps its commands; a process
that is killed (SIGKILL, or a DataLoader worker ended with its trainer) runs nothing, and a
command that is not writing then lives on: one still waiting for its network, or opened ahead
of time by prefetching, until its next write fails.

So the first command a process starts also starts a watcher: a small process that reads, from
a pipe only this process writes to, the process group of each command as it starts (``+``)
and as it is reaped (``-``). When every holder of the pipe's write end is gone (this process,
which a forked child closes: a DataLoader worker starts a watcher of its own), the watcher
reads the end of the pipe, kills the groups still listed, and ends.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

_WATCHER = """
import os, signal, sys
live = set()
for line in sys.stdin.buffer:
    group = int(line[1:])
    if line[:1] == b"+":
        live.add(group)
    else:
        live.discard(group)
for group in live:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""
"""The watcher's program: the groups still listed when the pipe ends are killed."""

_lock = threading.Lock()
_pipe: int | None = None
"""The write end of the pipe to this process's watcher; -1 where none could be started."""
_watcher_pid = 0


def watch(group: int) -> None:
    """Have process group ``group`` (a command just started) killed if this process ends
    before :func:`forget` is called for it."""
    _tell(b"+%d\n" % group)


def forget(group: int) -> None:
    """Process group ``group`` is reaped: the watcher no longer kills it (its number may be
    given to another group)."""
    _tell(b"-%d\n" % group)


def _tell(line: bytes) -> None:
    global _pipe
    with _lock:
        if _pipe is None:
            _pipe = _start()
        if _pipe < 0:
            return
        try:
            os.write(_pipe, line)  # one line, under PIPE_BUF: written whole
        except OSError:  # the watcher is gone (killed by hand): commands are reaped as before
            os.close(_pipe)
            _pipe = -1
            with contextlib.suppress(ChildProcessError):
                os.waitpid(_watcher_pid, os.WNOHANG)  # no zombie of it is left


def _start() -> int:
    """Start the watcher, in a session of its own (a Ctrl-C to the trainer's group must not
    end it before it acts), and return the write end of its pipe; -1 where it cannot start.
    It is spawned without a ``subprocess.Popen`` to keep: this process never waits for it (it
    ends after this process), and a Popen left running warns when the interpreter ends."""
    global _watcher_pid
    read_end, write_end = os.pipe()  # neither is inherited by the commands this process runs
    try:
        _watcher_pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-S", "-c", _WATCHER],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            ],
            setsid=True,
        )
    except (OSError, AttributeError, NotImplementedError):  # no posix_spawn or no setsid here
        os.close(write_end)
        return -1
    finally:
        os.close(read_end)
    return write_end


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) starts a watcher of its own with its first
    command: its commands must end with it, not with its parent. The parent's pipe is closed
    here, as its lock is replaced (a fork taken while another thread held it would leave it
    held for good)."""
    global _lock, _pipe, _watcher_pid
    _lock = threading.Lock()
    if _pipe is not None and _pipe >= 0:
        os.close(_pipe)
    _pipe, _watcher_pid = None, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
