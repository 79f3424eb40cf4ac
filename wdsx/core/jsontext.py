"""JSON from data: ``json.loads`` whose every failure is a ``ValueError``.

Python's parser recurses once per level of nesting, so a line of ten thousand ``[`` raises
``RecursionError`` (a ``RuntimeError``), which callers that catch ``ValueError`` for bad JSON
would let through. Everything wdsx parses from a shard, a manifest, an index or a server's
reply goes through :func:`parse_json`.
"""

from __future__ import annotations

import json
from typing import Any


def parse_json(text: str | bytes | bytearray) -> Any:
    """The value of the JSON ``text``; ``ValueError`` when it is not JSON or is nested too
    deeply for the parser."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to parse") from None
