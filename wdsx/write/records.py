"""Completion records of planned shards, and their merge into the dataset's manifest.

Each written shard is followed by a small hidden record beside it (``.<shard>.json``). A
shard counts as done when its record names the current plan and the shard is there at the
recorded size. Whoever sees every shard of the plan done writes the manifest (the records'
entries, plus the plan's extra fields and ``write: {fingerprint, skipped_by_shard}``) and
removes the records; once the manifest exists, it is where a re-run finds what is done.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from wdsx.core.jsontext import parse_json
from wdsx.read.manifest import Manifest, ShardEntry, read_if_present
from wdsx.sources import SourceOptions, local_path
from wdsx.write.partial import write_whole

__all__ = ["SECTION", "Records", "plan_of", "read_record", "record_url", "write_record"]

SECTION = "write"
"""The manifest field that holds the plan's fingerprint and what each shard left out."""


def record_url(shard_url: str) -> str:
    """Where the completion record of ``shard_url`` goes: ``out/a-000001.tar`` ->
    ``out/.a-000001.tar.json``."""
    directory, _, base = shard_url.rpartition("/")
    return f"{directory}/.{base}.json" if directory else f".{base}.json"


def write_record(url: str, record: dict[str, Any], options: SourceOptions | None) -> None:
    """Write one completion record, atomically."""
    write_whole(url, json.dumps(record).encode("utf-8"), options)


def read_record(url: str, options: SourceOptions | None) -> dict | None:
    """The completion record at ``url``, or None when there is none."""
    data = read_if_present(url, options)
    return None if data is None else parse_json(data)


def _is_complete(url: str, entry: dict) -> bool:
    """A recorded shard still there, at its recorded size (remote shards: the record suffices)."""
    path = local_path(url)
    if path is None:
        return True
    try:
        return os.stat(path).st_size == entry["bytes"]
    except FileNotFoundError:
        return False


def plan_of(manifest: Manifest) -> str | None:
    """The fingerprint of the plan that wrote ``manifest`` (None: no ``write_dataset`` plan)."""
    return manifest.extra.get(SECTION, {}).get("fingerprint")


def _manifest_records(manifest_url: str, plan_id: str, options: SourceOptions | None) -> dict[str, dict]:
    """Shard name -> completion record, from the manifest of a finished run of the same plan."""
    manifest = Manifest.load(manifest_url, options)
    if manifest is None or plan_of(manifest) != plan_id:
        return {}
    skipped_by_shard = manifest.extra[SECTION].get("skipped_by_shard", {})
    return {
        entry.name: {"shard": asdict(entry), "skipped": skipped_by_shard.get(entry.name, [])}
        for entry in manifest.shards
    }


class Records:
    """Completion records of a plan's shards: in the manifest once a run has finished, else in
    the per-shard record files."""

    def __init__(self, urls: Sequence[str], manifest_url: str, plan_id: str, options: SourceOptions | None):
        self.urls = urls
        self.manifest_url = manifest_url
        self.plan_id = plan_id
        self.options = options
        self.from_manifest = _manifest_records(manifest_url, plan_id, options)

    def get(self, number: int) -> dict | None:
        """The record of shard ``number`` if the shard is complete, else None."""
        url = self.urls[number]
        record = self.from_manifest.get(posixpath.basename(url))
        if record is None:
            record = read_record(record_url(url), self.options)
            if record is None or record.get("fingerprint") != self.plan_id:
                return None
        return record if _is_complete(url, record["shard"]) else None

    def finish(
        self,
        extra: dict[str, Any],
        complete_extra: Callable[[list[ShardEntry], dict[str, Any]], dict[str, Any]] | None = None,
    ) -> bool:
        """Write the manifest if every shard is complete; True if the manifest is in place.

        Processes write their records before calling this, so the last one to finish sees
        them all. Two finishing at once write the same bytes; one may find the records already
        merged and removed by the other, and then finds the manifest instead.
        """
        found = [self.get(number) for number in range(len(self.urls))]
        records = [record for record in found if record is not None]
        if len(records) < len(found):
            return bool(_manifest_records(self.manifest_url, self.plan_id, self.options))
        shards = [ShardEntry(**record["shard"]) for record in records]
        skipped = {
            shard.name: record["skipped"]
            for shard, record in zip(shards, records, strict=True)
            if record["skipped"]
        }
        if complete_extra is not None:
            extra = complete_extra(shards, extra)
        fields = {**extra, SECTION: {"fingerprint": self.plan_id, "skipped_by_shard": skipped}}
        write_whole(self.manifest_url, Manifest(shards, fields).to_json().encode("utf-8"), self.options)
        for url in self.urls:
            path = local_path(record_url(url))
            if path is not None and os.path.exists(path):
                os.unlink(path)
        return True
