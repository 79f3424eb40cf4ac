"""Field sets: new fields for an existing dataset, kept in shards of their own and joined to
the base shards by sample key while reading.

A field set lives in its own directory. For each base shard (``.../train-000003.tar``) it holds
a shard with the same basename whose samples carry the base samples' ``__key__`` and only the
new fields, in base order; a base sample that got no new fields has no entry there (a
*missing key*). Its manifest (:class:`~wdsx.read.manifest.Manifest`) lists the field shards as
usual and describes the join in an extra field::

    "field_set": {"version": 1,
                  "base": [{"name": "train-000003.tar", "samples": n, "sha256": hex or null}, ...],
                  "fields": ["emb.npy", "txt"],
                  "missing": {"train-000003.tar": 2}}

``base`` is aligned one to one with the manifest's ``shards``; ``missing`` counts, per field
shard, the base samples without an entry (shards with none are left out).

The join happens where a shard is read (:func:`join_fields`, called by
:func:`wdsx.read.shard.read_piece`), so a joined sample keeps its base sample's position and
resume, buffer refills and elastic re-deals read the fields again exactly as they read the
base samples. Two ways to treat a base sample that the field set has no entry for:

- ``missing="error"`` (the default): field shard ``i``-th sample must have the key of the base
  shard's ``i``-th sample; a mismatch, a field shard that ends early or one that goes on past
  the base shard is a :class:`~wdsx.core.errors.ShardError` naming the field shard, the keys
  and the byte offsets. The field shard is read alongside the base shard, from the same ordinal.
- ``missing="skip"``: base samples without an entry are dropped, and so are field samples
  whose key is not in the base shard. The field shard's keys are first read from its headers
  (a seek from header to header for a local shard; remote shards are streamed once for it),
  and each base sample then takes its fields by key, so resuming is exact whatever the order
  of the field set. Reading stays one forward pass when the field set's keys are in base
  order, as :func:`wdsx.write.fieldsets.write_field_set` writes them.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from wdsx.core.compression import uncompressed
from wdsx.core.errors import ShardError, reraise_exception
from wdsx.read import formats
from wdsx.read.manifest import Manifest, shard_name
from wdsx.read.samples import POSITION, Cursor, group_members
from wdsx.read.shard import ReadSettings, bytes_left, read_piece
from wdsx.read.tar import scan_headers
from wdsx.sources import SourceOptions, lister_for, open_source, scheme_of
from wdsx.sources.local import local_path
from wdsx.sources.urls import without_query
from wdsx.state.position import Position

FIELD_SET = "field_set"
"""The manifest's extra field that makes it a field set's manifest."""
VERSION = 1
MISSING_MODES = ("error", "skip")


@dataclass(frozen=True)
class FieldShard:
    """One shard of a field set and what it records about the base shard it was made for."""

    url: str
    base_name: str
    """The base shard's basename (the same as the field shard's)."""
    base_samples: int
    base_sha256: str | None
    sha256: str | None
    bytes: int
    missing: int
    """Base samples without an entry in this shard."""


@dataclass
class FieldSet:
    """The shards of one field set, found by the basename of the base shard they extend."""

    manifest_url: str
    fields: tuple[str, ...]
    shards: tuple[FieldShard, ...]
    _by_base: dict[str, FieldShard] = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def load(cls, location: str, options: SourceOptions | None = None) -> FieldSet:
        """The field set whose manifest is at ``location`` (a ``.json`` URL), or the one field
        set in the directory ``location``. ValueError when there is none or several."""
        if without_query(location).endswith(".json"):
            manifest = Manifest.load(location, options)
            if manifest is None:
                raise ValueError(f"field set manifest {location} not found")
            return cls.from_manifest(manifest, location)
        found = []
        for url in _manifests_in(location, options):
            manifest = Manifest.load(url, options)
            if manifest is not None and FIELD_SET in manifest.extra:
                found.append((url, manifest))
        if len(found) != 1:
            names = ", ".join(url for url, _ in found) or "none"
            raise ValueError(
                f"{location}: expected one field set manifest (a manifest with a {FIELD_SET!r} field), "
                f"found {names}; name the manifest URL instead"
            )
        return cls.from_manifest(found[0][1], found[0][0])

    @classmethod
    def from_manifest(cls, manifest: Manifest, manifest_url: str) -> FieldSet:
        """The field set a manifest describes; its shards lie beside ``manifest_url``."""
        record = manifest.extra.get(FIELD_SET)
        if not isinstance(record, dict) or record.get("version") != VERSION:
            raise ValueError(f"{manifest_url}: not a version {VERSION} field set manifest")
        base, missing = record.get("base"), record.get("missing") or {}
        if not isinstance(base, list) or len(base) != len(manifest.shards):
            raise ValueError(f"{manifest_url}: the field set's base list does not match its shards")
        directory = without_query(manifest_url)
        directory = directory[: directory.rfind("/") + 1]
        shards = tuple(
            FieldShard(
                directory + entry.name,
                str(made_for["name"]),
                int(made_for["samples"]),
                made_for.get("sha256"),
                entry.sha256,
                entry.bytes,
                int(missing.get(entry.name, 0)),
            )
            for entry, made_for in zip(manifest.shards, base)
        )
        return cls(manifest_url, tuple(record.get("fields", ())), shards)

    def shard_for(self, base_url: str) -> FieldShard:
        """The field shard made for the base shard at ``base_url`` (matched by basename)."""
        if len(self._by_base) != len(self.shards):
            self._by_base = {shard.base_name: shard for shard in self.shards}
        shard = self._by_base.get(shard_name(base_url))
        if shard is None:
            raise ShardError(base_url, None, f"the field set {self.manifest_url} has no shard for this shard")
        return shard


def _manifests_in(directory: str, options: SourceOptions | None) -> list[str]:
    """The manifest URLs (``*manifest.json``) directly in ``directory``."""
    prefix = directory if directory.endswith("/") else directory + "/"
    path = local_path(prefix)
    if path is not None:
        if not os.path.isdir(path):
            raise ValueError(f"field set directory {directory} not found")
        names = sorted(os.listdir(path))
        return [prefix + name for name in names if name.endswith("manifest.json")]
    lister = lister_for(prefix)
    if lister is None:
        raise ValueError(f"{directory}: this store cannot be listed; name the field set's manifest URL")
    urls = lister(prefix, options or SourceOptions())
    return sorted(url for url in urls if "/" not in url[len(prefix) :] and url.endswith("manifest.json"))


@dataclass
class FieldJoin:
    """Field sets to join to every base sample while reading, and how (picklable: it travels
    in :class:`~wdsx.read.shard.ReadSettings` to DataLoader workers).

    Args:
        sets: the field sets, joined in this order.
        missing: ``"error"`` or ``"skip"``, see the module's description.
        overwrite: let a field set replace a field the sample already has (from the base or an
            earlier field set); otherwise that is a ShardError.
    """

    sets: tuple[FieldSet, ...]
    missing: str = "error"
    overwrite: bool = False
    _sha256: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)
    _sizes: dict[str, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.missing not in MISSING_MODES:
            raise ValueError(f"missing fields must be one of {MISSING_MODES}, not {self.missing!r}")
        for shard in (shard for fields in self.sets for shard in fields.shards):
            self._sizes[shard.url] = shard.bytes
            if shard.sha256:
                self._sha256[shard.url] = shard.sha256

    @classmethod
    def load(
        cls,
        locations: str | FieldSet | Iterable[str | FieldSet],
        missing: str = "error",
        overwrite: bool = False,
        options: SourceOptions | None = None,
    ) -> FieldJoin:
        """A join of the field sets at ``locations`` (manifest URLs, directories or loaded
        sets; one of them alone is a list of one)."""
        if isinstance(locations, (str, FieldSet)):
            locations = [locations]
        sets = tuple(
            location if isinstance(location, FieldSet) else FieldSet.load(location, options)
            for location in locations
        )
        return cls(sets, missing, overwrite)

    def field_settings(self, settings: ReadSettings) -> ReadSettings:
        """How field shards are read: members as they are (no renaming or selecting), errors
        raised to the base shard's reader, sizes and hashes from the field sets' manifests."""
        return replace(
            settings,
            handler=reraise_exception,
            select_files=None,
            rename_files=None,
            add_local_path=False,
            sha256=self._sha256,
            sizes=self._sizes,
            index_sizes=False,
            fields=None,
        )


class _FieldStream:
    """The samples of one field shard, read forward from where they are wanted."""

    def __init__(self, url: str, settings: ReadSettings):
        self.url, self.settings = url, settings
        self._cursor: Cursor | None = None
        self._samples: Iterator[dict[str, Any]] | None = None

    def open(self, cursor: Cursor) -> None:
        self.close()
        self._cursor, self._samples = cursor, read_piece(self.url, cursor, None, self.settings)

    def next(self) -> dict[str, Any] | None:
        """The next sample, or None at the end of the shard."""
        assert self._samples is not None
        return next(self._samples, None)

    def at(self, position: Position) -> dict[str, Any]:
        """The sample at ``position`` (found by a header scan), reading forward to it, or
        reopening the shard there when it lies behind or far ahead."""
        gap = self.settings.options.chunk * (1 if scheme_of(self.url) == "file" else 8)
        here = None if self._cursor is None else self._cursor.offset
        if self._samples is None or here is None or not 0 <= position.offset - here <= gap:
            self.open(Cursor(position.offset, position.ordinal))
        assert self._samples is not None
        for sample in self._samples:
            found = sample[POSITION].offset
            if found == position.offset:
                return sample
            if found > position.offset:
                break
        raise ShardError(self.url, position.offset, "no sample starts here (was the field shard rewritten?)")

    def close(self) -> None:
        if self._samples is not None:
            getattr(self._samples, "close", lambda: None)()
            self._samples = None


class _Aligned:
    """``missing="error"``: the field shard's samples, one for each base sample, same keys."""

    def __init__(self, stream: _FieldStream, base_url: str, first: int):
        self.stream, self.base_url = stream, base_url
        stream.open(Cursor(None, first))

    def fields_for(self, sample: dict[str, Any]) -> dict[str, Any]:
        key, where = sample["__key__"], sample[POSITION].offset
        found = self.stream.next()
        if found is None:
            raise ShardError(
                self.stream.url,
                None,
                f"the field shard ends before base sample {key!r} (byte offset {where} of "
                f"{self.base_url}); use missing_fields='skip' to drop base samples without fields",
            )
        if found["__key__"] != key:
            raise ShardError(
                self.stream.url,
                found[POSITION].offset,
                f"field sample {found['__key__']!r} where base shard {self.base_url} has sample {key!r} "
                f"(at its byte offset {where}); use missing_fields='skip' to join by key",
            )
        return found

    def finish(self, base_samples: int) -> None:
        extra = self.stream.next()
        if extra is not None:
            raise ShardError(
                self.stream.url,
                extra[POSITION].offset,
                f"field sample {extra['__key__']!r} comes after the last of the {base_samples} samples "
                f"of base shard {self.base_url}",
            )


class _Keyed:
    """``missing="skip"``: each base sample's fields found by key (None: it has none)."""

    def __init__(self, stream: _FieldStream, settings: ReadSettings):
        self.stream = stream
        self.index = key_positions(stream.url, settings)
        self.joined: set[str] = set()
        """The keys of the base samples joined so far in this pass over the base shard."""

    def fields_for(self, sample: dict[str, Any]) -> dict[str, Any] | None:
        key = sample["__key__"]
        position = self.index.get(key)
        if position is None:
            return None
        if key in self.joined:
            raise ShardError(sample[POSITION].url, sample[POSITION].offset, _twice(key, "base shard"))
        self.joined.add(key)
        return self.stream.at(position)

    def finish(self, base_samples: int) -> None:
        pass


def key_positions(url: str, settings: ReadSettings) -> dict[str, Position]:
    """Where each sample of the field shard at ``url`` starts, by key, from its tar headers;
    a key held by two samples is a :class:`ShardError` (a join by key cannot tell which base
    sample each belongs to)."""
    names = member_names(url, settings.options, settings.max_member)
    members = ((name, offset, b"") for name, offset in names)
    positions: dict[str, Position] = {}
    for sample in group_members(members, url, Cursor(0, 0)):
        position = positions.setdefault(sample["__key__"], sample[POSITION])
        if position is not sample[POSITION]:
            raise ShardError(url, sample[POSITION].offset, _twice(sample["__key__"], "field shard"))
    return positions


def _twice(key: str, shard: str) -> str:
    return (
        f"key {key!r} is held by two samples of the {shard}: missing_fields='skip' joins by key and "
        "cannot tell which fields belong to which; give the samples distinct keys, or join in order "
        "with missing_fields='error'"
    )


def member_names(
    url: str, options: SourceOptions, max_member: int | None = None
) -> Generator[tuple[str, int], None, None]:
    """``(name, byte offset)`` of every member of the tar shard at ``url``, from its headers
    alone: a local shard is read header by header, seeking over payloads; others are streamed."""
    with open_source(url, 0, options) as source:
        stream, compressed = uncompressed(source.read)
        plain_file = source.local_path is not None and not compressed
        headers = scan_headers(
            stream.read,
            source.skip if plain_file else None,
            url,
            available=bytes_left(source, 0) if plain_file else None,
            max_member=max_member,
        )
        for name, offset, _ in headers:
            yield name, offset


def join_fields(
    url: str,
    cursor: Cursor,
    stop: int | None,
    samples: Iterator[dict[str, Any]],
    settings: ReadSettings,
    count: int | None,
) -> Generator[dict[str, Any], None, None]:
    """The base samples of one piece of the shard at ``url`` (from ``cursor`` up to ordinal
    ``stop``) with the fields of ``settings.fields``' field sets added. ``count``, when known,
    is the base shard's sample count."""
    join = settings.fields
    assert join is not None
    if formats.format_of(url) != "tar":
        raise ShardError(url, None, "field sets extend tar shards only")
    first, field_settings = cursor.ordinal, join.field_settings(settings)
    shards = [fields.shard_for(url) for fields in join.sets]
    # Renaming or selecting members can change how many samples a shard has.
    counted = settings.select_files is None and settings.rename_files is None
    for shard in shards:
        _check_made_for(shard, url, settings.expected_hash(url), count if counted else None)
    readers: list[_Aligned | _Keyed] = []
    try:
        for shard in shards:
            stream = _FieldStream(shard.url, field_settings)
            readers.append(
                _Aligned(stream, url, first) if join.missing == "error" else _Keyed(stream, field_settings)
            )
        for sample in samples:
            if _add_fields(sample, readers, join.overwrite):
                yield sample
        if stop is None or cursor.ordinal < stop:  # the base shard ended
            for shard, reader in zip(shards, readers):
                _check_made_for(shard, url, None, cursor.ordinal if counted else None)
                reader.finish(cursor.ordinal)
    finally:
        for reader in readers:
            reader.stream.close()


def _add_fields(sample: dict[str, Any], readers: Sequence[_Aligned | _Keyed], overwrite: bool) -> bool:
    """Add each reader's fields to ``sample``; False when one has none for it (skip mode)."""
    found = [reader.fields_for(sample) for reader in readers]
    if any(fields is None for fields in found):
        return False
    for reader, fields in zip(readers, found):
        assert fields is not None
        for name, value in fields.items():
            if name.startswith("__"):
                continue
            if name in sample and not overwrite:
                raise ShardError(
                    reader.stream.url,
                    fields[POSITION].offset,
                    f"sample {sample['__key__']!r} already has a field {name!r}; pass "
                    "overwrite_fields=True to let the field set replace it",
                )
            sample[name] = value
    return True


def _check_made_for(shard: FieldShard, url: str, sha256: str | None, samples: int | None) -> None:
    """A field shard made for another version of the base shard (another SHA-256 or sample
    count than the base's manifest or reading gives) is an error."""
    if sha256 and shard.base_sha256 and sha256 != shard.base_sha256:
        raise ShardError(
            shard.url,
            None,
            f"the field set was made for another version of {url}: it records SHA-256 "
            f"{shard.base_sha256}, the base shard's manifest {sha256}",
        )
    if samples is not None and samples != shard.base_samples:
        raise ShardError(
            shard.url,
            None,
            f"the field set was made for another version of {url}: it records {shard.base_samples} "
            f"samples for it, the base shard has {samples}",
        )
