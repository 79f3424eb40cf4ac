"""Every environment variable the code reads is on the reference page.

The variables are found by reading wdsx's source, not from a list kept by hand: every
``os.environ[...]``, ``os.environ.get(...)``, ``os.getenv(...)`` and ``... in os.environ`` (and
the same on a mapping named ``environ``), with the name resolved from a string, a module
constant, a local assignment, a loop over a module-level table, or, when the name is a
parameter, from the arguments of every call of that helper in the module (so
``_positive(MAX_MEMBER)`` in ``wdsx/core/limits.py`` yields ``WDSX_MAX_MEMBER_BYTES``). A name
built from a prefix (``f"AZURE_STORAGE_{n}"``, ``"WDS_" + name``) or read by prefix (the
store clients' caches, ``ClientCache(("AWS_",))``) must have its prefix on the page.
"""

from __future__ import annotations

import ast
import functools
import glob
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PAGE = os.path.join(ROOT, "docs", "reference", "environment.md")

PREFIX_READERS = {"ClientCache"}
"""Callables whose string arguments are prefixes of the variables they read."""


@dataclass
class Module:
    """One source file's tree, its string constants and its functions by name."""

    path: str
    tree: ast.Module
    constants: dict[str, ast.expr] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    @classmethod
    def parse(cls, path: str) -> Module:
        with open(path) as stream:
            module = cls(path, ast.parse(stream.read(), path))
        for node in module.tree.body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
            ):
                module.constants[node.targets[0].id] = node.value
        for node in ast.walk(module.tree):
            if isinstance(node, ast.FunctionDef):
                module.functions[node.name] = node
            for child in ast.iter_child_nodes(node):
                module.parents[child] = node
        return module

    def enclosing_function(self, node: ast.AST) -> ast.FunctionDef | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef):
                return node
        return None


def is_environ(node: ast.expr) -> bool:
    """``os.environ``, or a mapping named ``environ`` (a parameter defaulting to it)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "environ"


def looked_up(node: ast.AST) -> ast.expr | None:
    """The name expression ``node`` reads from the environment, if it reads one."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and is_environ(node.value):
        return node.slice
    if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        function = node.func
        if function.attr == "get" and is_environ(function.value):
            return node.args[0]
        if function.attr == "getenv" and isinstance(function.value, ast.Name) and function.value.id == "os":
            return node.args[0]
    if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
        if is_environ(node.comparators[0]):
            return node.left
    return None


def names(module: Module, expression: ast.expr, site: ast.AST, seen: frozenset = frozenset()) -> set[str]:
    """The variable names (or ``PREFIX*`` patterns) ``expression`` at ``site`` can hold."""
    if isinstance(expression, ast.Constant) and isinstance(expression.value, str):
        return {expression.value}
    if isinstance(expression, ast.JoinedStr):
        head = expression.values[0]
        return {head.value + "*"} if isinstance(head, ast.Constant) else set()
    if isinstance(expression, ast.BinOp) and isinstance(expression.op, ast.Add):
        return {name + "*" for name in names(module, expression.left, site, seen)}
    if not isinstance(expression, ast.Name):
        return set()
    function = module.enclosing_function(site)
    key = (function.name if function else "", expression.id)  # a helper may pass its parameter on
    if key in seen:
        return set()
    return resolve_name(module, expression.id, site, seen | {key})


def resolve_name(module: Module, name: str, site: ast.AST, seen: frozenset) -> set[str]:
    """What the variable ``name`` used at ``site`` holds: a local, a loop target, a parameter
    (resolved at the helper's call sites) or a module constant."""
    function = module.enclosing_function(site)
    if function is not None:
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == name for target in node.targets
            ):
                return names(module, node.value, node, seen)
            if isinstance(node, ast.For | ast.comprehension) and name in {
                target.id for target in ast.walk(node.target) if isinstance(target, ast.Name)
            }:
                return strings_in(module, node.iter)
        parameters = [argument.arg for argument in function.args.args]
        if name in parameters or (function.args.vararg and function.args.vararg.arg == name):
            return helper_arguments(module, function, name, seen)
    if name in module.constants:
        return names(module, module.constants[name], module.tree, seen)
    return set()


def strings_in(module: Module, expression: ast.expr) -> set[str]:
    """Every string in ``expression``, or in the module-level table it names."""
    if isinstance(expression, ast.Name) and expression.id in module.constants:
        expression = module.constants[expression.id]
    return {
        node.value
        for node in ast.walk(expression)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def helper_arguments(module: Module, helper: ast.FunctionDef, parameter: str, seen: frozenset) -> set[str]:
    """The names passed as ``parameter`` in every call of ``helper`` in the module."""
    parameters = [argument.arg for argument in helper.args.args]
    found: set[str] = set()
    for node in ast.walk(module.tree):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == helper.name
        ):
            continue
        if helper.args.vararg and helper.args.vararg.arg == parameter:
            passed = node.args[len(parameters) :]
        else:
            index = parameters.index(parameter)
            passed = [node.args[index]] if index < len(node.args) else []
            passed += [keyword.value for keyword in node.keywords if keyword.arg == parameter]
        for argument in passed:
            found |= names(module, argument, node, seen)
    return found


def variables_read(paths: list[str]) -> dict[str, set[str]]:
    """Each variable name or ``PREFIX*`` pattern the files read, with the files that read it."""
    found: dict[str, set[str]] = {}
    for path in paths:
        module = Module.parse(path)
        for node in ast.walk(module.tree):
            expression = looked_up(node)
            read = names(module, expression, node) if expression is not None else set()
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in PREFIX_READERS
            ):
                read |= {prefix + "*" for argument in node.args for prefix in strings_in(module, argument)}
            for name in read:
                found.setdefault(name, set()).add(os.path.relpath(path, ROOT))
    return found


def scan_package() -> dict[str, list[str]]:
    """:func:`variables_read` over every module of the package, as JSON-ready lists."""
    found = variables_read(sorted(glob.glob(os.path.join(ROOT, "wdsx", "**", "*.py"), recursive=True)))
    return {name: sorted(files) for name, files in found.items()}


@functools.cache
def read_by_wdsx() -> dict[str, set[str]]:
    """:func:`scan_package`, once per session, in a fresh interpreter: in a full parallel run,
    CPython 3.11 once refused to parse any source in a test process after earlier tests there
    ("AST constructor recursion depth mismatch"), which is no finding about the docs."""
    code = (
        "import json, sys; from tests.test_docs_environment import scan_package; "
        "json.dump(scan_package(), sys.stdout)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return {name: set(files) for name, files in json.loads(done.stdout).items()}


def test_the_scan_finds_the_variables_behind_helpers_and_tables():
    from wdsx.core import limits, topology
    from wdsx.sources import stall

    found = read_by_wdsx()
    behind_helpers = {limits.MAX_MEMBER, limits.MAX_INFLATE_RATIO, limits.INFLATE_GRACE, limits.MAX_LINE}
    behind_helpers |= {limits.MAX_IMAGE_PIXELS, stall.STALL_TIMEOUT, "WDS_SECURE", "WDSX_ALLOW_PICKLE"}
    in_tables = {name for pair in topology._RANK_VARIABLES for name in pair}
    assert behind_helpers | in_tables <= set(found)
    assert {"AZURE_STORAGE_*", "AWS_*", "WDS_*"} <= set(found)


def test_every_environment_variable_read_is_documented():
    with open(PAGE) as stream:
        page = stream.read()
    missing = {
        name: sorted(files) for name, files in read_by_wdsx().items() if f"`{name.rstrip('*')}" not in page
    }
    assert not missing, f"environment variables read by the code but not in {PAGE}: {missing}"
