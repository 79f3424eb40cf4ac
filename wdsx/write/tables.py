"""Tables of records as writer inputs: CSV, JSONL and Parquet files read into records, and the
sample function that turns one record into a sample.

A record becomes ``{"__key__": <key column or the record's number>, "json": <the record>}`` by
default; ``fields`` stores chosen columns as fields instead (``{"caption": "txt"}``), and
``files`` reads the file a column names into a field (``{"image_path": "jpg"}``, relative paths
taken from the table's folder) — reading files is something the user asks for by naming the
column, never a default.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wdsx.core.errors import WriteError
from wdsx.core.extras import install_hint
from wdsx.core.jsontext import parse_json
from wdsx.write.dataset import WriteReport, write_dataset

__all__ = ["TABLE_SUFFIXES", "RecordSamples", "read_table", "write_table"]

TABLE_SUFFIXES = (".csv", ".jsonl", ".parquet")


def read_table(path: str) -> list[dict[str, Any]]:
    """The records of a CSV file (a header row, values as strings), a JSONL file (one JSON
    object per line; a bad line is a ValueError naming the line) or a Parquet file (needs
    ``pyarrow``)."""
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as file:
            return list(csv.DictReader(file))
    if path.endswith(".jsonl"):
        records = []
        with open(path, "rb") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                try:
                    record = parse_json(line)
                except ValueError as exn:
                    raise ValueError(f"{path}, line {number}: {exn}") from None
                if not isinstance(record, dict):
                    raise ValueError(f"{path}, line {number}: a record must be a JSON object")
                records.append(record)
        return records
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet
        except ImportError:
            raise ImportError(f"reading Parquet needs pyarrow: {install_hint('ray', 'pyarrow')}") from None
        return list(pyarrow.parquet.read_table(path).to_pylist())
    raise ValueError(f"{path}: not a table ({', '.join(TABLE_SUFFIXES)})")


@dataclass(frozen=True)
class RecordSamples:
    """One record -> one sample (picklable, for worker processes and Ray tasks)."""

    key: str | None = None
    """The column whose value is the sample's key; None: the record's number."""
    fields: Mapping[str, str] = field(default_factory=dict)
    """Column -> field name (extension) for columns stored as fields; empty: the whole record
    as ``json``."""
    files: Mapping[str, str] = field(default_factory=dict)
    """Column -> field name for columns that name a file whose bytes become the field."""
    folder: str = "."
    """Where relative file paths in ``files`` columns start."""

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        if self.key is not None:
            sample["__key__"] = str(record[self.key])
        if not self.fields and not self.files:
            sample["json"] = record
        for column, name in self.fields.items():
            sample[name] = record[column]
        for column, name in self.files.items():
            with open(os.path.join(self.folder, str(record[column])), "rb") as file:
                sample[name] = file.read()
        return sample


def write_table(
    path: str,
    dest: str,
    *,
    key: str | None = None,
    fields: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
    **settings: Any,
) -> WriteReport:
    """Write the records of the table at ``path`` as shards at ``dest``, one sample per record
    (see :class:`RecordSamples` for ``key``, ``fields`` and ``files``); ``settings`` are
    :func:`~wdsx.write.dataset.write_dataset`'s (``maxcount``, ``workers``, ``engine``...)."""
    records = read_table(path)
    if not records:
        raise WriteError(f"{path}: the table has no records")
    columns = set().union(*records)
    named = [key] if key is not None else []
    missing = [name for name in [*named, *(fields or {}), *(files or {})] if name not in columns]
    if missing:
        raise WriteError(f"{path}: no column {missing[0]!r} (its columns: {', '.join(sorted(columns))})")
    to_samples = RecordSamples(
        key, dict(fields or {}), dict(files or {}), os.path.dirname(os.path.abspath(path))
    )
    describe = _RecordName(key)
    return write_dataset(records, to_samples, dest, describe=describe, **settings)


@dataclass(frozen=True)
class _RecordName:
    """How a record is named in reports: its key column's value, or the whole record."""

    key: str | None

    def __call__(self, record: dict[str, Any]) -> str:
        return str(record.get(self.key)) if self.key is not None else str(record)
