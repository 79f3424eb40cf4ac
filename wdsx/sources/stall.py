"""When a read that is still receiving bytes counts as stalled.

A socket timeout catches a server that sends nothing at all, but not one that trickles: a byte
every half second keeps every ``recv`` alive and a shard would take days. So a read is judged
by its rate over a window: a source keeps a :class:`StallWatch` that adds up the time spent
*waiting inside reads* (time the caller spends between reads is not the server's fault) and the
bytes those reads received. Once ``min_rate * window`` bytes have arrived the window starts
over; when more than ``window`` seconds of waiting bring fewer, the read is stalled.

The window is ``SourceOptions.stall_timeout``, else the ``WDSX_STALL_TIMEOUT`` environment
variable (read when a source opens, so it reaches DataLoader workers), else
:data:`DEFAULT_STALL_SECONDS`. A stalled remote read is retried from its last byte like a
dropped connection (:mod:`wdsx.sources.retry`); a stalled ``pipe:`` command cannot be asked
again for the same bytes, and fails.
"""

from __future__ import annotations

import os

from wdsx.core.env import number_from_environment
from wdsx.sources.base import SourceOptions

STALL_TIMEOUT = "WDSX_STALL_TIMEOUT"
"""The environment variable giving the stall window in seconds, when the options do not."""
DEFAULT_STALL_SECONDS = 60.0


def stall_window(options: SourceOptions) -> float:
    """The stall window of ``options``: its ``stall_timeout``, else ``WDSX_STALL_TIMEOUT``, else 60 s."""
    if options.stall_timeout is not None:
        seconds: float = options.stall_timeout
        said = f"SourceOptions.stall_timeout={seconds!r}"
    else:
        found = number_from_environment(STALL_TIMEOUT, float, "a number of seconds")
        if found is None:
            return DEFAULT_STALL_SECONDS
        seconds, said = found, f"{STALL_TIMEOUT}={os.environ.get(STALL_TIMEOUT)!r}"
    if not seconds > 0:
        raise ValueError(f"the stall window must be a positive number of seconds ({said})")
    return seconds


def read_timeout(options: SourceOptions) -> float:
    """How long one network read may wait for its first byte: the timeout, or the stall window
    when that is shorter (a silent server is then found within one window)."""
    return min(options.timeout, stall_window(options))


class StallWatch:
    """Waiting time and bytes received since the rate was last found healthy."""

    def __init__(self, options: SourceOptions):
        self.window = stall_window(options)
        self.min_rate = max(0, options.min_rate)
        self._needed = max(1, int(self.min_rate * self.window))
        self.restart()

    def restart(self) -> None:
        """Start a new window (after healthy progress, or once a stall has been dealt with)."""
        self.waited = 0.0
        self.received = 0

    def remaining(self) -> float:
        """Seconds of waiting left before the current window is over."""
        return max(0.0, self.window - self.waited)

    def stalled(self) -> str | None:
        """What went wrong, when the window is over and too few bytes came in it; else None."""
        if self.waited > self.window and self.received < self._needed:
            return (
                f"stalled: {self.received} bytes in {self.waited:.1f}s of waiting "
                f"(less than {self.min_rate} bytes/s over {self.window:g}s)"
            )
        return None

    def record(self, waited: float, received: int) -> bool:
        """Count one read; True when it completed a healthy window (which then starts over)."""
        self.waited += waited
        self.received += received
        if self.received >= self._needed:
            self.restart()
            return True
        return False
