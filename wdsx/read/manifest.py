"""Shard manifests: one JSON file beside a dataset's shards giving each shard's sample count,
size and SHA-256.

Readers use the counts to split an epoch at sample granularity without opening every shard;
the hashes let ``verify`` check shards. The writer produces the manifest for free while
writing; :func:`build_manifest` (``wdsx index``) makes one for shards written by other tools,
and :func:`scan_counts` counts one shard cheaply (headers only) when there is no manifest.

Format (``version`` 1)::

    {"format": "wdsx-manifest", "version": 1, "total_samples": N, <extra fields>,
     "shards": [{"name": "train-000000.tar", "samples": n, "bytes": size, "sha256": hex}, ...]}

Shards are matched by basename, so a manifest stays valid when the dataset is copied elsewhere.
A shard URL's query string (a presigned URL's signature) is no part of its name: the manifest
is looked up beside the shard's path, without the query (a signature covers one object, so no
signed URL of the manifest can be derived from the shard's; name it explicitly to use one).
A manifest, like an offset index, is read only up to ``SourceOptions.max_companion_bytes``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from wdsx.core.compression import uncompressed
from wdsx.core.errors import Handler, ShardError, SourceError
from wdsx.core.jsontext import parse_json
from wdsx.read import formats
from wdsx.read.jsonl import Overlong, count_lines, decompressed, line_sample, lines
from wdsx.read.npy import count_rows, parse_header
from wdsx.read.samples import Cursor, group_members
from wdsx.read.shard import bytes_left
from wdsx.read.tar import scan_headers
from wdsx.sources import DEFAULT_OPTIONS, SourceOptions, open_sink, open_source
from wdsx.sources.base import read_up_to
from wdsx.sources.urls import without_query

FORMAT = "wdsx-manifest"
VERSION = 1
_RESERVED = frozenset(("format", "version", "total_samples", "shards"))


def _split_dir(url: str) -> tuple[str, str]:
    """The directory part of ``url``'s path (with its ``/``) and the file name, query left off."""
    url = without_query(url)
    cut = url.rfind("/") + 1
    return url[:cut], url[cut:]


def _manifest_name(directory: str, before: str, after: str = "") -> str:
    """The manifest beside a family of shards whose names are ``before``, a number, ``after``
    (suffix left off): the two parts joined by one separator, without the ones at the ends."""
    before, after = before.rstrip("-_."), after.lstrip("-_.")
    stem = f"{before}-{after}" if before and after else before or after
    return directory + (f"{stem}.manifest.json" if stem else "manifest.json")


_DIRECTIVE = re.compile(r"%[-#0 +]*\d*[diouxX]")
_NUMBER = re.compile(r"\d+")
_SIBLINGS_COMPARED = 64
"""How many other shards of a dataset are enough to tell which number in its names counts them."""


def _refuse_commands(url: str) -> None:
    """A manifest URL derived from a ``pipe:`` URL would be a shell command nobody wrote
    (``pipe:CMD x.tar`` -> ``pipe:CMD x.manifest.json``): never derive one."""
    if url.startswith("pipe:"):
        raise ValueError(
            f"no manifest URL can be derived from {url!r}: it would run a command you did not write; "
            "name the manifest explicitly"
        )


def manifest_url_for_pattern(pattern: str) -> str:
    """The manifest URL for a shard pattern: ``out/train-%06d.tar`` -> ``out/train.manifest.json``.

    Same directory; the basename up to the ``%`` directive with trailing ``-_.`` removed, or
    ``manifest.json`` when nothing is left (``s3://b/p/%05d.tar`` -> ``s3://b/p/manifest.json``).
    Text after the directive (the shard suffix left off) joins it with a ``-``:
    ``out/a-%06d-train.tar`` -> ``out/a-train.manifest.json``, which is where readers look
    for the manifest of ``out/a-000003-train.tar``. ValueError for a ``pipe:`` pattern.
    """
    _refuse_commands(pattern)
    directory, base = _split_dir(pattern)
    directive = _DIRECTIVE.search(base)
    if directive is None:
        return manifest_url_for_shard(pattern)
    return _manifest_name(directory, base[: directive.start()], _without_suffix(base[directive.end() :]))


def manifest_url_for_shard(url: str, siblings: Sequence[str] = ()) -> str:
    """The manifest URL a shard's dataset gets when one is made for it (``wdsx index``): the
    first of :func:`manifest_urls_for_shard`. ValueError for a ``pipe:`` URL."""
    return manifest_urls_for_shard(url, siblings)[0]


def manifest_urls_for_shard(url: str, siblings: Sequence[str] = ()) -> list[str]:
    """Where the manifest of the shard at ``url`` may be, in the order readers look, each name
    the one a writer's pattern gives (:func:`manifest_url_for_pattern`) for some shape of name;
    the names alone cannot always tell which shape:

    - where the dataset's other shards (``siblings``) differ from it in one run of digits with
      text after it, that number counts the shards: it goes, and the text joins with a ``-``
      (``out/a-000003-val.tar`` beside ``out/a-000004-val.tar`` -> ``out/a-val.manifest.json``,
      ``train-00000-of-00010.tar`` beside ``train-00001-of-00010.tar`` ->
      ``train-of-00010.manifest.json``);
    - the name without its suffix and its trailing digits (``out/train-000003.tar`` ->
      ``out/train.manifest.json``; ``https://h/d/train-000003.tar?X-Amz-Signature=...`` ->
      ``https://h/d/train.manifest.json``);
    - the name without its last number, the text after it joined with a ``-`` (a dataset of
      one shard, ``out/a-000000-val.tar`` -> ``out/a-val.manifest.json``).

    ValueError for a ``pipe:`` URL."""
    _refuse_commands(url)
    directory, base = _split_dir(url)
    base = _without_suffix(base)
    return _places(directory, base, _counting_run(base, [_name_of(other) for other in siblings]))


def _name_of(url: str) -> str:
    return _without_suffix(_split_dir(url)[1])


def _places(directory: str, base: str, counting: int | None) -> list[str]:
    """:func:`manifest_urls_for_shard` for the name ``base`` (suffix left off) whose run of
    digits number ``counting`` counts the shards, where its siblings tell."""
    runs = list(_NUMBER.finditer(base))

    def without(run: re.Match[str]) -> str:
        return _manifest_name(directory, base[: run.start()], base[run.end() :])

    places = [without(runs[counting])] if counting is not None else []
    places.append(_manifest_name(directory, base.rstrip("0123456789")))
    if runs:
        places.append(without(runs[-1]))
    return list(dict.fromkeys(places))


def _counting_run(name: str, others: Sequence[str]) -> int | None:
    """Which run of digits in ``name`` counts the shards: the one run whose digits differ in
    the names of ``others`` written around their digits alike (up to
    :data:`_SIBLINGS_COMPARED` of them); None where no single run does."""
    parts, runs = _NUMBER.split(name), _NUMBER.findall(name)
    varying: set[int] = set()
    compared = 0
    for other in others:
        if compared == _SIBLINGS_COMPARED:
            break
        if _NUMBER.split(other) == parts:
            compared += 1
            pairs = enumerate(zip(runs, _NUMBER.findall(other)))
            varying.update(index for index, (mine, theirs) in pairs if mine != theirs)
    return varying.pop() if len(varying) == 1 else None


def find_manifest(
    url: str, siblings: Sequence[str] = (), options: SourceOptions | None = None
) -> tuple[Manifest | None, str | None]:
    """The manifest beside the shard at ``url`` (one of ``siblings``) and where it is: the
    first of :func:`manifest_urls_for_shard` that holds one; ``(None, None)`` where none does
    or for a ``pipe:`` shard. A file there that is not a manifest raises ValueError."""
    if url.startswith("pipe:"):
        return None, None
    for place in manifest_urls_for_shard(url, siblings):
        found = Manifest.load(place, options)
        if found is not None:
            return found, place
    return None, None


def _without_suffix(name: str) -> str:
    """``name`` without its shard suffix (``.tar``, ``.tar.gz``, ``.jsonl``...), if it has one."""
    for suffix in formats.SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def manifest_places(urls: Sequence[str], options: SourceOptions | None = None) -> list[str | None]:
    """For each shard of ``urls``, where its manifest is (:func:`find_manifest`), else where
    one would be made for it; None for a ``pipe:`` shard. Shards of one folder whose names
    have one shape (the same text around their digits) are one family, looked up once."""
    families: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for url in urls:
        if not url.startswith("pipe:"):
            directory, base = _split_dir(url)
            families.setdefault((directory, tuple(_NUMBER.split(_without_suffix(base)))), []).append(url)
    held: dict[str, bool] = {}  # whether a place holds a manifest, each place read once
    place_of: dict[str, str] = {}
    for (directory, _), members in families.items():
        names = [_name_of(member) for member in members]
        counting = _counting_run(names[0], names)
        for member, name in zip(members, names):
            places = _places(directory, name, counting)
            for place in places:
                if place not in held:
                    held[place] = Manifest.load(place, options) is not None
            place_of[member] = next((place for place in places if held[place]), places[0])
    return [place_of.get(url) for url in urls]


def manifest_url_beside(url: str, siblings: Sequence[str] = ()) -> str | None:
    """Where the manifest of the shard at ``url`` (one of ``siblings``, see
    :func:`manifest_url_for_shard`) would be, or None for a ``pipe:`` shard (whose manifest
    cannot be looked up without running a command nobody wrote)."""
    return None if url.startswith("pipe:") else manifest_url_for_shard(url, siblings)


def shard_name(url: str) -> str:
    """The name a manifest lists the shard at ``url`` under: the basename of its path."""
    return posixpath.basename(without_query(url))


def natural_key(name: str) -> list[Any]:
    """Sort key that orders ``s-2.tar`` before ``s-10.tar``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


@dataclass(frozen=True)
class ShardEntry:
    """One shard in a manifest."""

    name: str
    """The shard's basename."""
    samples: int
    bytes: int
    sha256: str | None = None


@dataclass
class Manifest:
    """The shards of a dataset with their sample counts, plus free-form ``extra`` fields."""

    shards: list[ShardEntry]
    extra: dict[str, Any] = field(default_factory=dict)
    _index: dict[str, ShardEntry] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def total_samples(self) -> int:
        return sum(shard.samples for shard in self.shards)

    def entry_for(self, url: str) -> ShardEntry | None:
        """The entry of the shard at ``url`` (matched by basename), or None if not listed."""
        if len(self._index) != len(self.shards):
            self._index = {shard.name: shard for shard in self.shards}
        return self._index.get(shard_name(url))

    def counts_for(self, urls: Iterable[str]) -> list[int] | None:
        """Sample counts of ``urls`` (matched by basename), or None if any shard is not listed."""
        counts = []
        for url in urls:
            entry = self.entry_for(url)
            if entry is None:
                return None
            counts.append(entry.samples)
        return counts

    def sha256_for(self, url: str) -> str | None:
        """The recorded SHA-256 of the shard at ``url`` (by basename), or None if unknown."""
        entry = self.entry_for(url)
        return entry.sha256 if entry else None

    def to_json(self) -> str:
        """The manifest as JSON text: one shard per line, extra fields in sorted order."""
        lines = [
            f'  "format": "{FORMAT}"',
            f'  "version": {VERSION}',
            f'  "total_samples": {self.total_samples}',
        ]
        lines += [f"  {json.dumps(key)}: {json.dumps(self.extra[key])}" for key in sorted(self.extra)]
        shards = ",\n".join("    " + json.dumps(asdict(shard)) for shard in self.shards)
        lines.append('  "shards": [\n' + shards + "\n  ]" if shards else '  "shards": []')
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse a manifest; ValueError if it is not one or is of a newer version."""
        data = parse_json(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError('not a wdsx manifest (missing "format": "wdsx-manifest")')
        if data.get("version") != VERSION:
            raise ValueError(
                f"unsupported wdsx manifest version {data.get('version')!r} (this wdsx reads {VERSION})"
            )
        shards = [
            ShardEntry(s["name"], int(s["samples"]), int(s["bytes"]), s.get("sha256")) for s in data["shards"]
        ]
        manifest = cls(shards, {k: v for k, v in data.items() if k not in _RESERVED})
        if "total_samples" in data and data["total_samples"] != manifest.total_samples:
            raise ValueError(f"manifest total_samples {data['total_samples']} != sum of shard samples")
        return manifest

    @classmethod
    def load(cls, url: str, options: SourceOptions | None = None) -> Manifest | None:
        """The manifest at ``url``, or None when there is no file there."""
        text = read_if_present(url, options)
        if text is None:
            return None
        try:
            return cls.from_json(text)
        except KeyError as exn:
            raise ValueError(f"{url}: not a manifest: an entry has no {exn} field") from exn
        except (ValueError, TypeError) as exn:
            raise ValueError(f"{url}: {exn}") from exn

    def write(self, url: str, options: SourceOptions | None = None) -> None:
        """Write the manifest to ``url``; it appears there complete or not at all."""
        with open_sink(url, options) as sink:
            sink.write(self.to_json().encode("utf-8"))

    @classmethod
    def merge(cls, parts: Iterable[Manifest]) -> Manifest:
        """One manifest from several (e.g. one per converter process), shards in name order.

        A shard listed twice must be listed identically, and so must an extra field.
        """
        shards: dict[str, ShardEntry] = {}
        extra: dict[str, Any] = {}
        for part in parts:
            for shard in part.shards:
                if shards.setdefault(shard.name, shard) != shard:
                    raise ValueError(f"manifests disagree about shard {shard.name!r}")
            for key, value in part.extra.items():
                if extra.setdefault(key, value) != value:
                    raise ValueError(f"manifests disagree about field {key!r}")
        return cls(sorted(shards.values(), key=lambda s: natural_key(s.name)), extra)


def read_if_present(url: str, options: SourceOptions | None = None) -> bytes | None:
    """The whole file at ``url`` (a manifest, an offset index), or None when nothing is stored
    under that name.

    A file larger than ``options.max_companion_bytes`` is a :class:`SourceError` (it is not
    read whole: an endless reply costs the limit). Other failures (network, permissions) raise.
    """
    limit = (options or DEFAULT_OPTIONS).max_companion_bytes
    try:
        with open_source(url, 0, options) as source:
            data = read_up_to(source.read, limit)
    except OSError as exn:
        if _is_absent(exn):
            return None
        raise
    if data is None:
        raise SourceError(
            url,
            f"larger than {limit} bytes, the most read of a manifest or an offset index "
            "(SourceOptions.max_companion_bytes)",
        )
    return data


_ABSENT_S3_CODES = frozenset(("NoSuchKey", "NotFound", "404"))


def _is_absent(error: BaseException | None) -> bool:
    """Whether an open failed because nothing is stored under the name: a FileNotFoundError, an
    error flagged ``not_found``, or one caused by an HTTP 404 or an S3 ``NoSuchKey``."""
    while error is not None:
        if isinstance(error, FileNotFoundError) or getattr(error, "not_found", False):
            return True
        if getattr(error, "code", None) == 404:  # urllib's HTTPError
            return True
        response = getattr(error, "response", None)  # botocore's ClientError
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in _ABSENT_S3_CODES:
            return True
        error = error.__cause__
    return False


def _drain(read: Callable[[int], bytes]) -> None:
    """Read to the end of the stream, keeping nothing (what passes is hashed by the reader)."""
    while read(1 << 20):
        pass


def _count(
    url: str,
    read: Callable[[int], bytes],
    skip: Callable[[int], object] | None,
    rename_files: Callable[[str], str] | None = None,
    select_files: Callable[[str], bool] | None = None,
    available: int | None = None,
    handler: Handler | None = None,
) -> int:
    """Samples in a tar stream, grouped exactly as readers group them; compression is detected.
    ``available``: the stream's size, when known (a local file). An error raises, or goes to
    ``handler``, and then the count is the samples a reader with that handler delivers: those
    before the error, the one being grouped included."""
    stream, compressed = uncompressed(read)
    if compressed:
        skip = available = None
    failure: list[Exception] = []

    def members() -> Iterator[tuple[str, int, bytes]]:
        try:
            for name, offset, _ in scan_headers(stream.read, skip, url, available=available):
                yield name, offset, b""
        except Exception as exn:
            if handler is None:
                raise
            failure.append(exn)  # the sample being grouped still counts, as readers deliver it

    samples = group_members(
        members(), url, Cursor(0, 0), rename_files=rename_files, select_files=select_files, handler=handler
    )
    count = sum(1 for _ in samples)
    if failure and handler is not None:
        handler(failure[0])
    return count


def scan_counts(
    url: str,
    options: SourceOptions | None = None,
    rename_files: Callable[[str], str] | None = None,
    select_files: Callable[[str], bool] | None = None,
    handler: Handler | None = None,
) -> int:
    """The number of samples in the shard at ``url``, reading only its headers where possible.

    Local files are read header by header, seeking over payloads; remote and compressed shards
    are streamed. Grouping follows :mod:`wdsx.read.samples` (metadata members skipped, consecutive
    members with one key form a sample), after ``rename_files`` and ``select_files``.
    JSONL shards are counted by their lines, ``.npy`` shards by their header.

    A shard that cannot be read raises, or, with a ``handler`` that does not raise (a
    dataset's), is reported to it and counted as the samples a reader with that handler
    delivers from it: those before the damage.
    """
    try:
        with open_source(url, 0, options) as source:
            if formats.format_of(url) != "tar":
                return _count_records(url, source.read)
            skip = source.skip if source.local_path else None
            available = bytes_left(source, 0)
            return _count(url, source.read, skip, rename_files, select_files, available, handler)
    except Exception as exn:  # a shard that cannot be opened is the shard's problem too
        if handler is None:
            raise
        handler(exn)
        return 0


def _count_records(url: str, read: Callable[[int], bytes]) -> int:
    """Samples in a JSONL stream (its lines) or an ``.npy`` stream (its rows, from its header)."""
    if formats.format_of(url) == "npy":
        return count_rows(url, read)
    return count_lines(url, decompressed(url, read))


class _Hashing:
    """Wraps a reader, hashing and counting every byte that passes."""

    def __init__(self, read: Callable[[int], bytes]):
        self._read = read
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int) -> bytes:
        data = self._read(n)
        self.digest.update(data)
        self.size += len(data)
        return data


def index_shard(url: str, options: SourceOptions | None = None) -> ShardEntry:
    """Read the shard at ``url`` once: its manifest entry, with sample count, size and SHA-256.
    A shard readers would fail on is refused as they refuse it (a :class:`ShardError` naming
    the shard and the offset): a tar's structure is parsed, every JSONL line parsed as JSON,
    and a ``.npy`` file's length checked against its header."""
    kind = formats.format_of(url)
    with open_source(url, 0, options) as source:
        hashing = _Hashing(source.read)
        if kind == "tar":
            samples = _count(url, hashing.read, None, available=bytes_left(source, 0))
        elif kind == "npy":
            header = parse_header(url, hashing.read)
            samples = header.rows
        else:
            samples = _parsed_lines(url, decompressed(url, hashing.read))
        _drain(hashing.read)  # the end-of-archive padding, the rows, or the compressed stream's tail
    if kind == "npy" and hashing.size < header.data_offset + header.data_bytes:
        raise ShardError(
            url,
            hashing.size,
            f"the shard is shorter than its header says: it ends after {hashing.size - header.data_offset} "
            f"of the {header.data_bytes} data bytes of shape {header.shape}",
        )
    return ShardEntry(shard_name(url), samples, hashing.size, hashing.digest.hexdigest())


def _parsed_lines(url: str, read: Callable[[int], bytes]) -> int:
    """The lines of a JSONL stream, each parsed as a reader parses it (the first one that is
    not valid JSON raises, naming its number and offset). A line longer than readers here
    accept is counted unparsed: that limit is the reader's memory setting, not the data's."""
    stem = posixpath.basename(without_query(url))
    count = 0
    for offset, line, ended in lines(read, 0, 1 << 20):
        if not isinstance(line, Overlong):
            line_sample(url, stem, offset, count, line, ended)
        count += 1
    return count


def build_manifest(urls: Sequence[str], options: SourceOptions | None = None) -> Manifest:
    """A manifest for existing shards, made by reading each once (``wdsx index``)."""
    return Manifest([index_shard(url, options) for url in urls])
