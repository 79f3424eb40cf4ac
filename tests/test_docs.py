"""The README and the documentation pages show code that works.

Every fenced ``python`` block of README.md and docs/**/*.md compiles (a quick test), and runs
(tests marked slow): first each page's ``wdsx ...`` shell lines, then each Python block, in a
scratch folder that holds the repository's data/ and docs/, as a reader who copies them would
run them from the repository's root. A block whose first line starts with ``# requires:``
needs an outside service (an S3 bucket...) and is only compiled; one whose first line starts
with ``# continues`` runs after the page's earlier blocks, in their namespace (a page that
builds one example step by step).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
from dataclasses import dataclass

import pytest

from wdsx.commands import cli

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
README = os.path.join(ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
README_LIMIT = 15_000
"""Bytes: the README is a front page that links into the docs, not the manual."""


@dataclass(frozen=True)
class Block:
    """One fenced code block: the page it is on, its place among the page's blocks of its
    language, and its code."""

    page: str
    number: int
    code: str

    @property
    def name(self) -> str:
        return f"{os.path.relpath(self.page, ROOT)} block {self.number}"

    @property
    def needs_service(self) -> bool:
        return self.code.startswith("# requires:")

    @property
    def continues(self) -> bool:
        return self.code.startswith("# continues")


def blocks(language: str) -> list[Block]:
    """Every ``language`` block of every page, in page order."""
    found = []
    for page in PAGES:
        with open(page) as stream:
            text = stream.read()
        codes = re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)
        found += [Block(page, number, code) for number, code in enumerate(codes)]
    return found


PYTHON_BLOCKS = blocks("python")
RUNNABLE = [block for block in PYTHON_BLOCKS if not block.needs_service]


def test_every_python_block_compiles():
    for block in PYTHON_BLOCKS:
        compile(block.code, block.name, "exec")


def test_readme_is_a_short_front_page():
    assert os.path.getsize(README) < README_LIMIT


def test_the_readmes_links_into_the_repository_resolve():
    with open(README) as stream:
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", stream.read())
    local = [target for target in targets if "://" not in target]
    assert local, "the README links into docs/"
    missing = [target for target in local if not os.path.exists(os.path.join(ROOT, target))]
    assert not missing


def test_every_subcommand_is_documented():
    with open(os.path.join(ROOT, "docs", "guide", "command.md")) as stream:
        page = stream.read()
    for module in cli.COMMANDS:
        command = module.rsplit(".", 1)[-1].replace("manifest", "index").replace("_", "-")
        assert f"`wdsx {command}" in page, command


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder that looks like the repository's root to the examples, after the pages' shell
    examples ran in it."""
    folder = tmp_path_factory.mktemp("docs")
    for name in ("data", "docs"):
        os.symlink(os.path.join(ROOT, name), folder / name)
    previous = os.getcwd()
    os.chdir(folder)
    try:
        for block in blocks("sh"):
            for line in block.code.splitlines():
                if line.startswith("wdsx "):
                    assert cli.main(shlex.split(line)[1:]) == 0, f"{block.name}: {line}"
        yield folder
    finally:
        os.chdir(previous)


@pytest.mark.slow
@pytest.mark.parametrize("block", RUNNABLE, ids=lambda block: block.name)
def test_python_block_runs(scratch, block):
    namespace = {"__name__": f"docs_block_{block.number}"}
    earlier = [other for other in RUNNABLE if other.page == block.page and other.number < block.number]
    for step in (earlier if block.continues else []) + [block]:
        exec(compile(step.code, step.name, "exec"), namespace)
