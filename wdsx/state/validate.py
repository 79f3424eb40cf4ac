"""Checking a checkpoint's fields as they are read, and its digest.

A checkpoint comes from a file a person can edit, truncate or mix up with another one, so
every state type reads its JSON through these helpers: each returns the field's value when
it has the expected type and range, and otherwise raises :class:`InvalidState`, which names
the field by its path in the JSON, what was expected and what was found::

    checkpoint field $.stages.shuffle.draws: expected an integer >= 0 and below 2**53, found -3 (int)

A state type only knows its own fields; :func:`within` adds the path of the state around
them (``stages.shuffle``), so each type validates what it owns and the error still says
where in the whole checkpoint the bad value sits.

The digest covers a checkpoint's whole JSON, so that a change a field check cannot see (a
byte offset moved by one, another epoch) is refused too; states written before it existed
carry none and load without that check.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from wdsx.core.errors import StateError
from wdsx.state.position import Position, PositionTable

DIGEST_KEY = "digest"

LARGEST = 2**53
"""The largest count, offset or index a checkpoint field holds by default: beyond what any
epoch reaches, and the largest integer every JSON reader keeps exactly."""


class InvalidState(StateError):
    """A checkpoint field that does not hold what its state type wrote."""

    def __init__(self, path: list[str | int] | str, expected: str = "", found: Any = None):
        # A DataLoader re-raises a worker's exception as its type called with the message
        # alone: then ``path`` is that message, and stays the error's text.
        super().__init__(path if isinstance(path, str) else expected)
        self.text = path if isinstance(path, str) else None
        self.path: list[str | int] = [] if isinstance(path, str) else path
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        if self.text is not None:
            return self.text
        where = "$" + "".join(f"[{key}]" if isinstance(key, int) else f".{key}" for key in self.path)
        return f"checkpoint field {where}: expected {self.expected}, found {_show(self.found)}"


class _Missing:
    def __repr__(self) -> str:
        return "nothing (the field is missing)"


MISSING: Any = _Missing()
"""What :class:`InvalidState` reports as found for a field that is absent."""


class Described(str):
    """What was found, described in words (shown as it is, not as a value)."""


def _show(value: Any) -> str:
    """A short, readable rendering of a found value."""
    if value is MISSING:
        return repr(value)
    if isinstance(value, Described):
        return str(value)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


@contextmanager
def within(*keys: str | int) -> Iterator[None]:
    """Prefix the path of an :class:`InvalidState` raised inside with ``keys``."""
    try:
        yield
    except InvalidState as error:
        error.path[:0] = keys
        raise


def invalid(key: str | int, expected: str, found: Any) -> InvalidState:
    """The error for field ``key`` (of the state being read) holding ``found``."""
    return InvalidState([key], expected, found)


def mapping(data: Any, what: str = "an object") -> dict[str, Any]:
    """``data`` itself, which must be a JSON object."""
    if not isinstance(data, dict):
        raise InvalidState([], what, data)
    return data


def field(data: dict[str, Any], key: str, default: Any = MISSING) -> Any:
    """``data[key]``, or ``default`` when given and the field is absent."""
    if key in data:
        return data[key]
    if default is MISSING:
        raise invalid(key, "a value", MISSING)
    return default


def integer(
    data: dict[str, Any], key: str, low: int | None = 0, high: int | None = LARGEST, default: Any = MISSING
) -> int:
    """An integer field within ``[low, high]`` (None: unbounded); booleans are not integers."""
    value = field(data, key, default)
    check_integer(value, key, low, high)
    return int(value)


def check_integer(value: Any, key: str | int, low: int | None = 0, high: int | None = LARGEST) -> None:
    """Refuse ``value`` (field ``key``) unless it is an integer within ``[low, high]``."""
    if type(value) is not int or (low is not None and value < low) or (high is not None and value > high):
        raise invalid(key, _range_text("an integer", low, high), value)


def _range_text(kind: str, low: int | None, high: int | None) -> str:
    if high == LARGEST:
        return f"{kind} >= {low} and below 2**53" if low is not None else f"{kind} below 2**53"
    if low is not None and high is not None:
        return f"{kind} from {low} to {high}" if low < high else f"{kind} equal to {low}"
    if low is not None:
        return f"{kind} >= {low}"
    if high is not None:
        return f"{kind} <= {high}"
    return kind


def optional_integer(
    data: dict[str, Any], key: str, low: int | None = 0, default: Any = MISSING
) -> int | None:
    """An integer field within ``[low, ...)``, or null."""
    value = field(data, key, default)
    if value is None:
        return None
    check_integer(value, key, low)
    return int(value)


def boolean(data: dict[str, Any], key: str, default: Any = MISSING) -> bool:
    """A true/false field."""
    value = field(data, key, default)
    if type(value) is not bool:
        raise invalid(key, "true or false", value)
    return value


def text(data: dict[str, Any], key: str, default: Any = MISSING, choices: tuple[str, ...] = ()) -> str:
    """A string field (one of ``choices`` when given)."""
    value = field(data, key, default)
    if not isinstance(value, str) or (choices and value not in choices):
        raise invalid(key, " or ".join(map(repr, choices)) if choices else "a string", value)
    return value


def optional_text(data: dict[str, Any], key: str, default: Any = MISSING) -> str | None:
    """A string field, or null."""
    value = field(data, key, default)
    if value is not None and not isinstance(value, str):
        raise invalid(key, "a string or null", value)
    return value


def listing(data: dict[str, Any], key: str, default: Any = MISSING, length: int | None = None) -> list[Any]:
    """A list field (of ``length`` items when given)."""
    value = field(data, key, default)
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise invalid(key, "a list" if length is None else f"a list of {length} items", value)
    return value


def integers(data: dict[str, Any], key: str, length: int | None = None, low: int | None = 0) -> list[int]:
    """A list field of integers, each within ``[low, ...)``."""
    values = listing(data, key, length=length)
    with within(key):
        for index, value in enumerate(values):
            check_integer(value, index, low)
    return list(values)


def positions(data: dict[str, Any], key: str, table: PositionTable) -> list[Position]:
    """A field of packed positions (:meth:`PositionTable.encode`), decoded against ``table``."""
    value = field(data, key)
    try:
        return table.decode(value)
    except StateError as error:
        raise invalid(key, f"packed positions ({error})", value) from None


def digest(state: dict[str, Any]) -> str:
    """The digest of a checkpoint's JSON, its own digest field left out: the same for any
    key order (and for the round trip through ``json``)."""
    body = {key: value for key, value in state.items() if key != DIGEST_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()[:32]


def signed(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its digest added."""
    return {**state, DIGEST_KEY: digest(state)}


def check_digest(state: dict[str, Any]) -> None:
    """Refuse a checkpoint whose digest (when it has one) does not match its content."""
    if DIGEST_KEY not in state:
        return
    saved = state[DIGEST_KEY]
    try:
        actual = digest(state)
    except (TypeError, ValueError) as error:
        found = Described(f"content that is not JSON ({error})")
        raise invalid(DIGEST_KEY, "a checkpoint of plain JSON values", found) from error
    if saved != actual:
        raise InvalidState(
            [DIGEST_KEY],
            f"{actual} (the digest of the checkpoint's content: changed or corrupted since it was saved)",
            saved,
        )
