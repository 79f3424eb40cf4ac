"""DataLoader workers that never outlive the process that started them.

PyTorch's worker looks for its parent only between batches, in its main thread, and then
leaves through Python's ordinary exit, which waits for the thread that feeds its result queue
to finish writing. A wdsx batch carries the worker's pipeline state (a full shuffle buffer is
tens of KB of positions), so the few batches a worker has ready fill the queue's pipe. When the
trainer dies, nobody reads that pipe any more, yet its read end stays open in the workers
themselves, so the write blocks forever instead of failing: the worker's exit waits for it,
another worker's writer waits for the pipe's lock, and they live on with their memory.

So each worker ties its life to its parent as it starts (:class:`TiedWorker`):

* a daemon thread looks every :data:`INTERVAL` seconds whether the parent is still there (its
  parent's pid is the one it started with, and the loader's process exists) and otherwise ends
  the process at once with ``os._exit``: no exit handler runs, so nothing can block it, and a
  worker stuck in a read, a decoder or a user function ends all the same;
* on Linux, in addition, the kernel kills the worker when its parent dies
  (``prctl(PR_SET_PDEATHSIG)``), which holds even while the worker's main thread keeps the GIL.
  The kernel follows the *thread* that started the worker, so this is used only when the
  loader started its workers from its main thread (a worker started from a thread that ends
  would otherwise die with that thread).

Ctrl-C is left to the trainer (:func:`leave_interrupts_to_the_trainer`), which may catch it and
go on with its loader.

Nothing of a dead worker stays behind: its batches travel in shared memory without a name
(:mod:`wdsx.loader.transport`), which the kernel frees with the last process that maps it,
and PyTorch's own segments (for small batches) are unlinked as soon as they are made.
On systems other than POSIX ones, workers rely on PyTorch's own checks.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 0.2
"""Seconds between two looks at the parent: a worker outlives its trainer at most this long."""

ORPHANED = 1
"""The exit status of a worker that ended because its parent was gone."""

_PR_SET_PDEATHSIG = 1


def _exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (one of another user counts as existing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_with_parent() -> None:
    """Ask Linux to kill this process when its parent thread ends."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl here: the watching thread still acts
        pass


def _watch(parent: int, loader: int, interval: float) -> None:
    while os.getppid() == parent and _exists(loader):
        time.sleep(interval)
    os._exit(ORPHANED)


def tie_to_parent(loader: int, from_main_thread: bool, interval: float = INTERVAL) -> None:
    """End this worker process as soon as its parent, or ``loader`` (the pid of the process
    that made the DataLoader), is gone. ``from_main_thread``: whether the loader started its
    workers from its main thread (see the module's description)."""
    if os.name != "posix":
        return
    parent = os.getppid()
    if sys.platform.startswith("linux") and (from_main_thread or parent != loader):
        _kill_with_parent()
    if parent != loader and not _exists(loader):  # the loader died before this worker started
        os._exit(ORPHANED)
    threading.Thread(
        target=_watch, args=(parent, loader, interval), name="wdsx-lifeline", daemon=True
    ).start()


def leave_interrupts_to_the_trainer() -> None:
    """Ignore Ctrl-C (SIGINT) in this worker. A terminal sends it to the trainer and its
    workers alike, and a worker that dies of it leaves a trainer that catches it (to save a
    checkpoint, say) with a broken loader. The trainer decides: when it stops, it ends its
    workers as at the end of an epoch."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class TiedWorker:
    """A DataLoader ``worker_init_fn`` that ties the worker's life to its parent
    (:func:`tie_to_parent`) and leaves Ctrl-C to the trainer
    (:func:`leave_interrupts_to_the_trainer`), then runs ``then`` (the user's, or another wdsx
    one, which may set its own handlers). Made in the process that starts the workers, which it
    records."""

    def __init__(self, then: Callable[[int], Any] | None):
        self.then = then
        self.loader = os.getpid()
        self.from_main_thread = threading.current_thread() is threading.main_thread()

    def __call__(self, worker_id: int) -> None:
        tie_to_parent(self.loader, self.from_main_thread)
        leave_interrupts_to_the_trainer()
        if self.then is not None:
            self.then(worker_id)
