"""Write a field set: new fields for an existing dataset, computed from its samples and stored
in shards of their own that readers join to the base by key (:mod:`wdsx.read.fieldsets`).

Each base shard becomes one job of a :class:`~wdsx.write.plan.WritePlan`, so a field set is
written like any dataset (:func:`wdsx.write.dataset.execute`): atomically, shard by shard,
skipping the shards a previous run of the same plan completed, by processes, launcher ranks
or Ray tasks. The field shard made for ``train-000003.tar`` has the same basename and holds,
in base order, one sample per base sample that the user's function gave fields, under the
base sample's key.

The manifest's ``field_set`` record names each base shard with its sample count and SHA-256
(from the base's manifest; without one, counted from its headers, SHA-256 null). Its
``fields`` and ``missing`` parts depend on what the function returned, so they are filled in
when the manifest is written: ``missing`` is each base shard's sample count less its field
shard's (one entry at most per base sample), ``fields`` is read from the field shards' headers
(:class:`CompleteRecord`).
"""

from __future__ import annotations

import posixpath
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from wdsx.codecs.encode import encode_sample
from wdsx.core.errors import EncodingError
from wdsx.read import formats
from wdsx.read.fieldsets import FIELD_SET, VERSION, member_names
from wdsx.read.manifest import (
    Manifest,
    ShardEntry,
    find_manifest,
    manifest_url_for_shard,
    scan_counts,
    shard_name,
)
from wdsx.read.samples import POSITION, Cursor, field_of
from wdsx.read.shard import ReadSettings, read_piece
from wdsx.sources import SourceOptions
from wdsx.sources.listing import expand_urls
from wdsx.sources.urls import without_query
from wdsx.write.dataset import WriteReport, execute, function_identity
from wdsx.write.jobs import JobRunner
from wdsx.write.plan import ShardJob, WritePlan, plan_fingerprint

__all__ = ["write_field_set"]

AddFields = Callable[[dict[str, Any]], "dict[str, Any] | None"]
"""What makes the new fields of one base sample (None or ``{}``: none for it)."""


@dataclass(frozen=True)
class FieldMaker:
    """The field samples of one base shard: ``add_fields`` applied to each of its samples, in
    order, under the base sample's key (picklable, to run in a worker process or a Ray task).

    A sample whose ``add_fields`` raises gets no entry and a warning (recorded in the report),
    unless ``strict``, which stops the run."""

    add_fields: AddFields
    strict: bool = False
    options: SourceOptions | None = None

    def __call__(self, base_url: str) -> Iterator[dict[str, Any]]:
        settings = ReadSettings(self.options or SourceOptions())
        with closing(read_piece(base_url, Cursor(0, 0), None, settings)) as samples:
            for sample in samples:
                del sample[POSITION]
                fields = self._fields_of(sample)
                if fields:
                    yield {"__key__": sample["__key__"], **fields}

    def _fields_of(self, sample: dict[str, Any]) -> dict[str, Any] | None:
        """The new fields of one base sample, without ``__`` entries, encoded here as the
        writer would encode them, so that a value that cannot be encoded costs only its own
        sample's entry."""
        key = sample["__key__"]
        try:
            fields = self.add_fields(sample)
        except Exception as exn:
            self._refuse(key, exn)
            return None
        if fields is None:
            return None
        if not isinstance(fields, dict):
            raise TypeError(f"add_fields must return a dict or None, not {type(fields).__name__}")
        if fields.get("__key__", key) != key:
            raise ValueError(f"add_fields gave key {fields['__key__']!r} for base sample {key!r}")
        new = {name: value for name, value in fields.items() if not name.startswith("__")}
        try:
            return encode_sample({"__key__": key, **new})
        except EncodingError as exn:
            self._refuse(key, exn)
            return None

    def _refuse(self, key: str, exn: Exception) -> None:
        """A sample whose fields could not be made: a warning and no entry, or, ``strict``, the error."""
        if self.strict:
            raise exn
        warnings.warn(f"sample {key!r}: {type(exn).__name__}: {exn} (it gets no entry)", stacklevel=1)


def base_shards(base: str | Sequence[str], options: SourceOptions | None = None) -> list[dict[str, Any]]:
    """``{"url", "name", "samples", "sha256"}`` of each base shard. ``base`` is a manifest URL
    (``.json``: its shards, beside it) or what ``WebDataset`` takes; then the counts and hashes
    come from the manifest beside the first shard when it lists them all, else the samples
    are counted from the shards' headers (SHA-256 unknown)."""
    if isinstance(base, str) and without_query(base).endswith(".json"):
        manifest = Manifest.load(base, options)
        if manifest is None:
            raise ValueError(f"manifest {base} not found")
        directory = without_query(base)[: without_query(base).rfind("/") + 1]
        urls = [directory + entry.name for entry in manifest.shards]
    else:
        urls = expand_urls(base, options)
        if not urls:
            raise ValueError(f"no base shards in {base!r}")
        try:
            manifest = find_manifest(urls[0], urls, options)[0]
        except ValueError:
            manifest = None
    entries = [manifest.entry_for(url) if manifest is not None else None for url in urls]
    return [
        {"url": url, "name": entry.name, "samples": entry.samples, "sha256": entry.sha256}
        if entry is not None and None not in entries
        else {"url": url, "name": shard_name(url), "samples": scan_counts(url, options), "sha256": None}
        for url, entry in zip(urls, entries)
    ]


def plan_field_set(
    base: Sequence[dict[str, Any]], dest: str, identity: Any, options: SourceOptions | None = None
) -> WritePlan:
    """One job per base shard (:func:`base_shards`), writing the field shard of the same
    basename into the directory ``dest``."""
    names = [shard["name"] for shard in base]
    if any(formats.format_of(name) != "tar" for name in names):
        raise ValueError("field sets extend tar shards only")
    if len(set(names)) != len(names):
        raise ValueError("the base shards' basenames must differ: field shards are named after them")
    directory = dest if dest.endswith("/") else dest + "/"
    made_for = [{key: shard[key] for key in ("name", "samples", "sha256")} for shard in base]
    inputs = [((number, shard["url"]),) for number, shard in enumerate(base)]
    plan_id = plan_fingerprint([identity, made_for], inputs)
    jobs = [ShardJob(number, directory + name, inputs[number], plan_id) for number, name in enumerate(names)]
    record = {"version": VERSION, "base": made_for, "fields": [], "missing": {}}
    manifest_url = manifest_url_for_shard(jobs[0].url, [job.url for job in jobs])
    return WritePlan(jobs, manifest_url, plan_id, {FIELD_SET: record}, CompleteRecord(directory, options))


@dataclass(frozen=True)
class CompleteRecord:
    """Fills in the ``fields`` and ``missing`` parts of a field set's record once its shards
    are all written (the plan's ``complete_extra``)."""

    directory: str
    options: SourceOptions | None = None

    def __call__(self, shards: list[ShardEntry], extra: dict[str, Any]) -> dict[str, Any]:
        record = extra[FIELD_SET]
        fields: set[str] = set()
        for entry in shards:
            for name, _ in member_names(self.directory + entry.name, self.options or SourceOptions()):
                field = field_of(name)
                if field is not None:
                    fields.add(field[1])
        missing = {
            entry.name: made_for["samples"] - entry.samples
            for entry, made_for in zip(shards, record["base"], strict=True)
            if made_for["samples"] != entry.samples
        }
        return {**extra, FIELD_SET: {**record, "fields": sorted(fields), "missing": missing}}


def write_field_set(
    base: str | Sequence[str],
    dest: str,
    add_fields: AddFields,
    *,
    engine: str = "local",
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    ray_address: str | None = None,
    options: SourceOptions | None = None,
    progress: bool = False,
    strict: bool = False,
    version: str = "",
) -> WriteReport:
    """Write the fields that ``add_fields`` makes of each sample of the dataset ``base`` as a
    field set in the directory ``dest``, to be read joined with it
    (``WebDataset(base, fields=[dest])``).

    ``base`` is a shard pattern, a list of shard URLs or the URL of the base's manifest.
    ``add_fields(sample)`` gets each base sample as read from its shard (``__key__`` and
    undecoded bytes fields) and returns a dict of new fields, named and encoded as
    :class:`~wdsx.TarWriter` names and encodes them, or None (the sample then has no entry).
    It must be picklable (a module-level function or a configured callable) for ``workers > 1``
    and Ray. A sample whose ``add_fields`` raises gets no entry and a warning in the report;
    ``strict`` stops the run instead.

    Engines, ranks and re-runs work as for :func:`wdsx.write.dataset.write_dataset`: the
    output depends on the base shards, the function's name and ``version`` (change it when the
    function changes).
    """
    identity = {"field_set": function_identity(add_fields), "version": version}
    plan = plan_field_set(base_shards(base, options), dest, identity, options)
    # FieldMaker encodes each sample's fields itself, so the writer takes its bytes as they are
    maker = FieldMaker(add_fields, strict, options)
    runner = JobRunner(maker, strict, posixpath.basename, options, encoder=False)
    return execute(
        plan,
        runner,
        engine=engine,
        workers=workers,
        rank=rank,
        world_size=world_size,
        ray_address=ray_address,
        progress=progress,
        unit="shard",
    )
