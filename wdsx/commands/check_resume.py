"""``wdsx check-resume``: prove that a user's own pipeline resumes exactly.

``wdsx check-resume train.py:make_loader --cuts 3 --epochs 2`` imports the function that builds
the loader (``module:function`` or ``path/to/file.py:function``), runs
:func:`wdsx.check_resume` on it and prints the report; the exit status is 0 when every
cut-and-resumed run yielded exactly what the uninterrupted run yielded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from wdsx.commands.common import positive_int
from wdsx.loader.check import check_resume


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check-resume", help="run a loader uninterrupted and cut-and-resumed, report the first difference"
    )
    parser.add_argument("spec", help="module:function or file.py:function that builds the loader")
    parser.add_argument(
        "--cuts",
        type=cut_points,
        default=3,
        help="number of cut points, or batch counts to cut after (3,10,20)",
    )
    parser.add_argument("--epochs", type=int, default=1, help="passes over the loader per run")
    parser.add_argument("--limit", type=int, default=None, help="compare only the first LIMIT batches")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    make_loader = load_function(args.spec)
    report = check_resume(make_loader, cuts=args.cuts, epochs=args.epochs, limit=args.limit)
    print(report)
    return 0 if report.identical else 1


def cut_points(text: str) -> int | list[int]:
    """An argparse type for ``--cuts``: a number of cut points, or batch counts separated by
    commas (a usage error, status 2, for anything else)."""
    return [positive_int(part.strip()) for part in text.split(",")] if "," in text else positive_int(text)


def load_function(spec: str) -> Callable[[], Any]:
    """The function named by ``module:function`` (imported with the current directory on the
    path, as ``python -m`` does) or ``file.py:function`` (its folder on the path, as
    ``python file.py`` has it)."""
    where, colon, name = spec.rpartition(":")
    if not colon or not where or not name:
        raise ValueError(f"{spec!r}: expected module:function or file.py:function")
    if where.endswith(".py") or os.sep in where:
        folder, file = os.path.split(os.path.abspath(where))
        module_name = os.path.splitext(file)[0]
        if module_name in sys.modules:  # never shadow a module already loaded (a file named json.py)
            module_name = f"_wdsx_check_{module_name}"
        found = importlib.util.spec_from_file_location(module_name, where)
        if found is None or found.loader is None:
            raise ValueError(f"{where}: not a Python file")
        sys.path.insert(0, folder)  # its own imports resolve as under ``python file.py``
        module = importlib.util.module_from_spec(found)
        sys.modules[module_name] = module  # so that pickled functions of it can be found again
        found.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exn:
            if exn.name != where and not where.startswith(f"{exn.name}."):
                raise  # the module itself imports something missing: its traceback says where
            raise ValueError(f"{spec!r}: no module named {where!r} (from the current directory)") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"{spec!r}: {where} has no function {name!r}")
    return function
