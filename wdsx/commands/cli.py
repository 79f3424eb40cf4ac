"""The ``wdsx`` command. Each subcommand lives in its own module, which provides
``add_parser(subparsers)`` (registering its arguments and ``run`` as the ``run`` default) and
``run(args) -> int``; adding a subcommand means adding its module to :data:`COMMANDS`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from wdsx.core.errors import WdsxError
from wdsx.core.redact import redact_text
from wdsx.version import __version__

COMMANDS = (
    "wdsx.commands.convert",
    "wdsx.commands.index",
    "wdsx.commands.info",
    "wdsx.commands.ls",
    "wdsx.commands.cat",
    "wdsx.commands.verify",
    "wdsx.commands.bench",
    "wdsx.commands.preview",
    "wdsx.commands.check_resume",
)
"""Modules providing subcommands, in the order ``wdsx --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand registered."""
    parser = argparse.ArgumentParser(prog="wdsx", description="Fast, exactly resumable WebDataset shards.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("--version", action="version", version=f"wdsx {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``wdsx`` with ``argv`` (default: the process's arguments); returns the exit status.

    Errors are printed as one line on stderr (status 1); usage errors exit with status 2.
    Output to a pipe that closes early (``wdsx ls x.tar | head -1``) ends the command quietly,
    with the status a shell gives a process that SIGPIPE ended (141). Every URL the command
    prints has its credentials masked (:mod:`wdsx.core.redact`): what a terminal shows ends up
    in logs and bug reports. (A field written raw with ``cat -f`` is written unchanged.)
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exn:
        return exn.code if isinstance(exn.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="wdsx: %(message)s")
    with _safe_output():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        status = args.run(args)
        sys.stdout.flush()  # a closed pipe is found here rather than when the interpreter exits
        return status
    except BrokenPipeError:
        _discard_stdout()
        return PIPE_CLOSED
    except KeyboardInterrupt:
        print("wdsx: interrupted", file=sys.stderr)
        return 130
    except (WdsxError, OSError, ValueError) as exn:
        print(f"wdsx {args.command}: error: {exn}", file=sys.stderr)
        return 1


_CONTROL = {
    code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(code) not in "\t\n\r"
}
"""Control characters but tab and line ends, written as escapes: a name in a shard must not
drive the terminal that shows it."""


class _SafeText:
    """A text stream that writes what it is given with the URLs in it redacted and control
    characters escaped (bytes written to its ``buffer`` go out as they are)."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact_text(text).translate(_CONTROL))
        return len(text)

    def write_control(self, sequence: str) -> None:
        """Write the command's own terminal control ``sequence`` as it is (a progress line
        erased, say)."""
        self._stream.write(sequence)

    def __getattr__(self, name: str) -> Any:  # flush, buffer, fileno, isatty...
        return getattr(self._stream, name)


@contextlib.contextmanager
def _safe_output() -> Iterator[None]:
    """Standard output and error, as text, redacted and escaped while a command runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _SafeText(sys.stdout), _SafeText(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


PIPE_CLOSED = 128 + 13
"""Exit status after the reader of stdout went away: a shell's status for death by SIGPIPE."""


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered for the closed pipe neither fails nor prints a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
