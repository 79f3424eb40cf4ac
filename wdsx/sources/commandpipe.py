"""webdataset's ``Pipe``: a file object over a command's standard output (or input).

wdsx reads ``pipe:`` shards with :class:`~wdsx.sources.pipe.PipeSource`; this class is the
object webdataset's ``gopen_pipe``/``gopen_curl``... return, for programs that build one
themselves or check ``isinstance(stream, Pipe)``. A non-zero exit status that is not in
``ignore_status`` raises ``OSError`` when the stream is read past the command's end or closed.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from typing import IO, Any

from wdsx.core.redact import redact_text

log = logging.getLogger("wdsx")


class Pipe:
    """Run a command (``Popen``'s arguments) and read its output (``mode="rb"``) or write its
    input (``mode="wb"``)."""

    def __init__(
        self,
        *args: Any,
        mode: str = "rb",
        timeout: float = 7200.0,
        ignore_errors: bool = False,
        ignore_status: Sequence[int] = (),
        **kw: Any,
    ):
        self.ignore_errors = ignore_errors
        self.ignore_status = [0, *ignore_status]
        self.timeout = timeout
        self.handler: Callable[[BaseException], bool] | None = None
        self.args = (args, kw)
        self.status: int | None = None
        start: Any = subprocess.Popen  # Popen's arguments, as the caller gives them
        if mode[:1] == "r":
            self.proc: subprocess.Popen[bytes] = start(*args, stdout=subprocess.PIPE, **kw)
            stream = self.proc.stdout
        elif mode[:1] == "w":
            self.proc = start(*args, stdin=subprocess.PIPE, **kw)
            stream = self.proc.stdin
        else:
            raise ValueError(f"{mode}: unknown mode")
        if stream is None:
            raise ValueError(f"{args}: couldn't open")
        self.stream: IO[bytes] = stream

    def __str__(self) -> str:
        return f"<Pipe {redact_text(str(self.args))}>"

    def check_status(self) -> None:
        """If the command has exited, collect its status (raising on a failure)."""
        if self.proc.poll() is not None:
            self.wait_for_child()

    def wait_for_child(self) -> None:
        """Wait for the command and raise ``OSError`` if its exit status is not accepted."""
        if self.status is None:
            self.status = self.proc.wait()
            if int(os.environ.get("GOPEN_VERBOSE", "0")):
                log.info("pipe exit [%s %d:%d] %s", self.status, os.getpid(), self.proc.pid, self)
        if self.status not in self.ignore_status and not self.ignore_errors:
            raise OSError(f"{redact_text(str(self.args))}: exit {self.status} (read)")

    def read(self, *args: Any, **kw: Any) -> bytes:
        result = self.stream.read(*args, **kw)
        self.check_status()
        return result

    def write(self, *args: Any, **kw: Any) -> int:
        result = self.stream.write(*args, **kw)
        self.check_status()
        return result

    def readLine(self, *args: Any, **kw: Any) -> bytes:  # noqa: N802 - webdataset's spelling
        result = self.stream.readline(*args, **kw)
        self.check_status()
        return result

    def close(self) -> None:
        """Close the stream, wait for the command (up to ``timeout``) and check its status."""
        if not self.stream.closed:
            self.stream.close()
            self.status = self.proc.wait(self.timeout)
            self.wait_for_child()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: S110 - a finalizer must not raise
            pass


def set_options(
    obj: Any,
    timeout: float | None = None,
    ignore_errors: bool | None = None,
    ignore_status: Sequence[int] | None = None,
    handler: Callable[[BaseException], bool] | None = None,
) -> bool:
    """Change the settings of a :class:`Pipe`; False (and nothing changed) for other objects."""
    if not isinstance(obj, Pipe):
        return False
    if timeout is not None:
        obj.timeout = timeout
    if ignore_errors is not None:
        obj.ignore_errors = ignore_errors
    if ignore_status is not None:
        obj.ignore_status = list(ignore_status)
    if handler is not None:
        obj.handler = handler
    return True
