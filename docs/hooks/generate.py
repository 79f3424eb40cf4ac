"""MkDocs hook: fills the pages' generated parts when the site is built.

A page asks for one by a line holding only a marker comment:

* ``<!-- generated: benchmarks -->``: tables and plots from ``benchmarks/results/*.json``;
* ``<!-- generated: cli -->``: each ``wdsx`` subcommand's ``--help``, from the parser itself.

So the performance page never holds a pasted number and the CLI page never drifts from the code.
It also shows the Sphinx roles of the docstrings (``:class:`~wdsx.x.Name```) as plain code, and
keeps warnings on under ``mkdocs build --strict --quiet`` (see :func:`on_config`).
"""

from __future__ import annotations

import logging
import os
import re
import sys

sys.path.insert(0, os.path.dirname(__file__))

from benchresults import performance_section  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def cli_section() -> str:
    """``wdsx --help`` and every subcommand's ``--help``, as the parser prints them."""
    from wdsx.commands.cli import build_parser

    parser = build_parser()
    subcommands = next(action for action in parser._actions if action.dest == "command")
    helps = [("wdsx", parser)] + [(f"wdsx {name}", sub) for name, sub in subcommands.choices.items()]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal's width; the page wants a fixed one
    try:
        sections = [f"## {title}\n\n```text\n{command.format_help()}```" for title, command in helps]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n\n".join(sections)


GENERATORS = {
    "<!-- generated: benchmarks -->": lambda: performance_section(RESULTS),
    "<!-- generated: cli -->": cli_section,
}


def on_config(config: object, **kwargs: object) -> None:
    """Let warnings through to strict mode's count, even under ``--quiet``.

    ``mkdocs build --quiet`` sets the ``mkdocs`` logger's level to ERROR, so a warning (a broken
    link or anchor, a missing API reference) is dropped before the handler that ``--strict``
    counts it with sees it, and the build passes. ``make docs`` passes both flags: lowering the
    level back to WARNING makes such a page fail the build (and prints why), while ``--quiet``
    still hides the INFO lines.
    """
    if getattr(config, "strict", False):
        logger = logging.getLogger("mkdocs")
        if logger.getEffectiveLevel() > logging.WARNING:
            logger.setLevel(logging.WARNING)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    """Replace each marker line with what its generator writes."""
    for marker, generate in GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    return markdown


ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc):<code>~?([\w.]+)</code>")
"""A docstring's Sphinx role as Markdown renders it: ``:class:<code>~wdsx.x.Name</code>``."""


def plain_roles(html: str) -> str:
    """Each role as plain code: ``~a.b.Name`` as ``Name`` (Sphinx's short form), others whole."""
    return ROLE.sub(lambda m: f"<code>{_shown(m.group(0), m.group(1))}</code>", html)


def _shown(role: str, target: str) -> str:
    return target.rsplit(".", 1)[-1] if ">~" in role else target


def on_page_content(html: str, **kwargs: object) -> str:
    """Docstrings' Sphinx roles, in the API reference, as plain code."""
    return plain_roles(html)
