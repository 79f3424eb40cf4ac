"""Which sample keys and field names a tar shard can hold so that readers give them back.

A sample's field is written as the member ``key + "." + field``. Readers (wdsx's, and
webdataset's, whose rules wdsx's reader follows) split a member name at the first dot of its
last path component, lower-case what follows, and skip names that look like metadata
(``__x__``). So, before any byte of a sample is written, a writer refuses with an
:class:`~wdsx.errors.EncodingError` naming the sample and the field:

- a key or field name that is not a non-empty ``str``, holds a NUL byte (it ends a name in a
  tar header) or a lone surrogate (it has no UTF-8 form; the surrogates that stand for the
  bytes of a file name that is not UTF-8, as ``os.listdir`` gives them, are written as
  those bytes and read back as they were);
- a field name holding ``/`` (the member would be a file in a directory, its field lost), or
  one that lower-casing changes (it would read back lower-cased);
- a key that starts with ``/`` or holds a ``..`` segment (tar tools strip or refuse such
  members when extracting them), or has a dot in its last component (readers split the name
  at its first dot: ``{"__key__": "a.b", "txt": ...}`` would come back as key ``a`` with field
  ``b.txt``, or not at all; webdataset writes it silently);
- with ``keep_meta``, a ``__bad__`` field (readers drop a sample that has one);
- a member name longer than :data:`MAX_NAME_BYTES`;
- any other name that the reader's own rule (:func:`wdsx.read.samples.field_of`) would skip
  or split differently (a newline in a key's directories, a ``__x__`` directory...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from wdsx.core.errors import EncodingError, shown_name
from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.samples import POSITION, field_of, is_meta

NEVER_WRITTEN = frozenset(("__key__", "__url__", "__local_path__", POSITION, "__pad__", EPOCH_SEED))
"""Fields that describe where a sample was read from; writing them back would be wrong."""

REFUSED_META = frozenset(("__bad__",))
"""Metadata fields that readers act on: a sample with ``__bad__`` is dropped by them."""

MAX_NAME_BYTES = 4096
"""The longest member name (key, dot and field, in UTF-8) a writer writes: no filesystem path
is longer on Linux, so a longer one could never be extracted."""


def _text_problem(name: str) -> str | None:
    """Why the str ``name`` cannot be a tar member name's text, or None."""
    if "\0" in name:
        return "holds a NUL byte, which ends a name in a tar header"
    if not name.isascii():
        try:
            name.encode("utf-8", "surrogateescape")  # how tar headers hold it, as readers decode it
        except UnicodeEncodeError:
            return "holds a lone surrogate, which has no UTF-8 form"
    return None


def key_problem(key: Any) -> str | None:
    """Why ``key`` cannot be a sample key in a tar shard, or None when it can."""
    if not isinstance(key, str):
        return f"__key__ must be a str, not {type(key).__name__}"
    if not key:
        return "__key__ is empty"
    problem = _text_problem(key)
    if problem is not None:
        return f"the key {problem}"
    if key[0] == "/":
        return "the key is an absolute path: tar tools strip the leading '/' when extracting"
    if ".." in key and ".." in key.split("/"):
        return "the key has a '..' segment: tar tools refuse such members when extracting"
    if key.rpartition("/")[2][:1] == ".":
        return "the key's last component starts with a dot: readers would read it under another key"
    return None


def field_problem(field: str, keep_meta: bool) -> str | None:
    """Why the str ``field`` cannot be a field name in a tar shard, or None when it can."""
    if not field:
        return "the field name is empty"
    problem = _text_problem(field)
    if problem is not None:
        return f"the field name {problem}"
    if "/" in field:
        return "a field name cannot hold '/': readers would take the member for a file in a directory"
    if field != field.lower():
        return f"readers lower-case field names, so it would read back as {field.lower()!r}"
    if keep_meta and field in REFUSED_META:
        return f"readers drop a sample that has a {field!r} field"
    return None


class NameChecker:
    """Checks the key and field names of each sample one writer is given (remembering the field
    names already found good)."""

    def __init__(self, keep_meta: bool):
        self.keep_meta = keep_meta
        self._good_fields: set[str] = set()

    def members(self, sample: Any) -> tuple[str, list[tuple[str, str]]]:
        """The key of ``sample`` and ``(field, member name)`` of each field to write, sorted
        (``_`` fields only with ``keep_meta``, never :data:`NEVER_WRITTEN`); an
        :class:`EncodingError` for a name that would not read back as written."""
        if not isinstance(sample, Mapping):
            raise EncodingError(f"a sample is a dict with a __key__, not a {type(sample).__name__}")
        if "__key__" not in sample:
            raise EncodingError("a sample must contain a __key__")
        key = sample["__key__"]
        problem = key_problem(key)
        if problem is not None:
            raise EncodingError(problem, key)
        last = key.rpartition("/")[2]
        # Readers split a name at the first dot of its last component unless it starts with "__"
        # (metadata?) or holds a newline (a pattern decides then). A key clear of both, with a
        # last component free of dots, splits as written with any field that passed
        # field_problem; every other name is put to the readers' own rule.
        plain = key[:2] != "__" and "\n" not in key and "." not in last and last != ""
        members = []
        for field in sample:
            if not isinstance(field, str):
                raise EncodingError(f"field names must be str, not {type(field).__name__}", key, field)
            if field[:1] == "_" and (not self.keep_meta or field in NEVER_WRITTEN):
                continue
            if field not in self._good_fields:
                problem = field_problem(field, self.keep_meta)
                if problem is not None:
                    raise EncodingError(problem, key, field)
                self._good_fields.add(field)
            name = key + "." + field
            if len(name) > MAX_NAME_BYTES // 4:  # else it fits, even at 4 bytes a character
                self._check_size(name, key, field)
            if not (plain and "\n" not in field) and field_of(name) != (key, field):
                self._explain(name, key, field)
            members.append((field, name))
        members.sort()
        return key, members

    @staticmethod
    def _check_size(name: str, key: str, field: str) -> None:
        size = len(name.encode("utf-8", "surrogateescape"))
        if size > MAX_NAME_BYTES:
            raise EncodingError(
                f"the member name is {size} bytes, more than the {MAX_NAME_BYTES} a writer allows", key, field
            )

    def _explain(self, name: str, key: str, field: str) -> None:
        """Refuse the member ``name``, saying how readers would read it instead."""
        split = field_of(name)
        if split is None:
            why = "as metadata" if is_meta(name) else "finding no key and field in its name"
            raise EncodingError(f"readers would skip the member {shown_name(name)} {why}", key, field)
        hint = (
            " (readers split a member name at the first dot of its file name: replace the dots "
            "in the key, e.g. with '_')"
            if "." in key.rpartition("/")[2]
            else ""
        )
        raise EncodingError(
            f"readers would read the member {shown_name(name)} as sample {shown_name(split[0])}, "
            f"field {shown_name(split[1])}{hint}",
            key,
            field,
        )
