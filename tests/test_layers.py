"""The package's layers: imports point down (README, "Design"). Each module's imports of wdsx
are read from its source with ``ast`` and checked against what its layer may import."""

from __future__ import annotations

import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "wdsx")

MAY_IMPORT = {
    "core": set(),
    "state": {"core"},
    "sources": {"core"},
    "codecs": {"core"},
    "read": {"sources", "state", "core"},
    "stages": {"read", "codecs", "sources", "state", "core"},
    "pipeline": {"stages", "read", "codecs", "sources", "state", "core"},
    "loader": {"pipeline", "stages", "read", "codecs", "sources", "state", "core"},
    "write": {"codecs", "read", "sources", "state", "core"},
}
"""Layers below the public faces; ``commands``, ``integrations`` and the top-level modules
may import anything."""


def modules() -> list[tuple[str, str]]:
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                layer = os.path.relpath(path, PACKAGE).split(os.sep)[0]
                found.append((layer if layer in MAY_IMPORT else "", path))
    return sorted(found)


def imported_layers(path: str) -> set[str]:
    with open(path) as stream:
        tree = ast.parse(stream.read())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0
    ]
    layers = set()
    for name in names:
        parts = name.split(".")
        if parts[0] == "wdsx":
            layers.add(parts[1] if len(parts) > 1 else "wdsx")
    return layers


@pytest.mark.parametrize("layer,path", [m for m in modules() if m[0]], ids=lambda v: os.path.basename(v))
def test_a_layer_imports_only_layers_below_it(layer, path):
    outside = imported_layers(path) - MAY_IMPORT[layer] - {layer}
    assert not outside, f"{os.path.relpath(path, PACKAGE)} ({layer}) imports {sorted(outside)}"


def test_no_relative_imports_hide_a_dependency():
    for _, path in modules():
        with open(path) as stream:
            tree = ast.parse(stream.read())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level], path
