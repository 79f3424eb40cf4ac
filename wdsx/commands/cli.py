"""The ``wdsx`` command. Each subcommand lives in its own module, which provides
``add_parser(subparsers)`` (registering its arguments and ``run`` as the ``run`` default) and
``run(args) -> int``; adding a subcommand means adding its module to :data:`COMMANDS`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from wdsx.core.errors import WdsxError

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
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``wdsx`` with ``argv`` (default: the process's arguments); returns the exit status.

    Errors are printed as one line on stderr (status 1); usage errors exit with status 2.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exn:
        return exn.code if isinstance(exn.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="wdsx: %(message)s")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("wdsx: interrupted", file=sys.stderr)
        return 130
    except (WdsxError, OSError, ValueError) as exn:
        print(f"wdsx {args.command}: error: {exn}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
