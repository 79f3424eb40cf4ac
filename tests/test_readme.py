"""The README's examples run: its `wdsx` commands, then each Python block, in a scratch folder
that holds the repository's data/ (blocks starting with ``# requires:`` need outside services
and are only compiled; blocks starting with ``# slow:`` run in a test marked slow)."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from wdsx.commands import cli

pytestmark = pytest.mark.slow  # every README example in a fresh scratch folder (make test runs them)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def blocks(language: str) -> list[str]:
    with open(os.path.join(ROOT, "README.md")) as stream:
        text = stream.read()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    os.symlink(os.path.join(ROOT, "data"), folder / "data")
    previous = os.getcwd()
    os.chdir(folder)
    for block in blocks("sh"):
        for line in block.splitlines():
            if line.startswith("wdsx "):
                assert cli.main(shlex.split(line)[1:]) == 0, line
    yield folder
    os.chdir(previous)


PYTHON_BLOCKS = blocks("python")
SLOW_BLOCKS = [number for number, code in enumerate(PYTHON_BLOCKS) if code.startswith("# slow:")]


def run_block(number: int) -> None:
    code = PYTHON_BLOCKS[number]
    exec(compile(code, f"README block {number}", "exec"), {"__name__": f"readme_{number}"})


@pytest.mark.parametrize("number", range(len(PYTHON_BLOCKS)))
def test_python_example_runs(scratch, number):
    code = PYTHON_BLOCKS[number]
    if code.startswith(("# requires:", "# slow:")):
        compile(code, f"README block {number}", "exec")
        return
    run_block(number)


@pytest.mark.slow
@pytest.mark.parametrize("number", SLOW_BLOCKS)
def test_slow_python_example_runs(scratch, number):
    run_block(number)


def test_readme_documents_every_subcommand():
    text = "".join(blocks("sh")) + open(os.path.join(ROOT, "README.md")).read()
    for module in cli.COMMANDS:
        assert f"wdsx {module.rsplit('.', 1)[-1].replace('manifest', 'index').replace('_', '-')}" in text
