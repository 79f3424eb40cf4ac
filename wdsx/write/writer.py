"""Write samples to tar shards: webdataset's ``TarWriter`` and ``ShardWriter``, deterministic and atomic.

Same arguments and member layout as webdataset 1.0.2 (``key + "." + ext`` in sorted extension
order, ``_`` fields only with ``keep_meta``), with these differences on purpose:

- the bytes are a pure function of the samples: mtime 0 unless given, gzip without a timestamp;
- a shard named by URL is written through :func:`wdsx.write.partial.open_shard_sink`, so it
  appears under its name only once complete (an exception inside ``with`` discards it), locally
  or on S3, and what a killed writer left of it is removed by the next writer of that shard;
- ``ShardWriter`` opens shards lazily (no empty shard when nothing is written, #376) and, at
  ``close()``, writes a manifest listing each shard's sample count, size and SHA-256;
- fields a reader adds (``__url__``, ``__local_path__``...) are never written back;
- a sample whose key or field names would not read back as written (:mod:`wdsx.write.names`)
  or whose value cannot be encoded is refused with an :class:`~wdsx.codecs.encode.EncodingError`
  before any byte of it is written: the writer goes on with the next sample;
- a failure while writing (a full disk) discards the shard: a writer given a URL leaves no file
  behind, and a ``ShardWriter`` then writes no manifest;
- ``ShardWriter`` checks its pattern when constructed.
"""

from __future__ import annotations

import bz2
import functools
import hashlib
import logging
import lzma
import os
import posixpath
import sys
import tarfile
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, BinaryIO, ClassVar, Protocol, TypeVar

from wdsx.codecs.encode import FieldEncoder, make_encoder
from wdsx.core.errors import EncodingError
from wdsx.read.manifest import Manifest, ShardEntry, manifest_url_for_pattern
from wdsx.read.tar import read_exact
from wdsx.sources import Sink, SourceOptions, local_path
from wdsx.write.names import NameChecker
from wdsx.write.partial import open_shard_sink, write_whole
from wdsx.write.tarformat import HeaderMaker, end_of_archive, padding

log = logging.getLogger("wdsx")

_FLUSH_AT = 1 << 20

_Bytes = bytes | bytearray | memoryview
"""What goes into a shard: payloads are passed on as given, so large ones are never copied."""


class _GzipCompressor:
    """gzip with a zeroed timestamp and "unknown" OS byte: the same bytes on every machine."""

    _HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"

    def __init__(self, level: int = 6):
        self._deflate = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._crc = 0
        self._size = 0
        self._header = self._HEADER

    def compress(self, data: bytes) -> bytes:
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)
        out, self._header = self._header + self._deflate.compress(data), b""
        return out

    def flush(self) -> bytes:
        trailer = self._crc.to_bytes(4, "little") + (self._size & 0xFFFFFFFF).to_bytes(4, "little")
        return self._header + self._deflate.flush() + trailer


_COMPRESSORS: dict[str, Callable[[], Any]] = {
    "gz": _GzipCompressor,
    "bz2": lambda: bz2.BZ2Compressor(9),
    "xz": lzma.LZMACompressor,
}


def compression_for(name: object, compress: bool | str | None) -> str | None:
    """webdataset's rule: ``compress`` if given (True means gz), else from the file name's ending."""
    if compress is False:
        return None
    if compress is True:
        return "gz"
    if isinstance(compress, str):
        if compress not in _COMPRESSORS:
            raise ValueError(f"unknown compression {compress!r}; use one of {sorted(_COMPRESSORS)}")
        return compress
    if isinstance(name, str):
        for kind in _COMPRESSORS:
            if name.endswith(kind):
                return kind
    return None


class _Output:
    """Buffers small writes into large ones, compresses, and hashes the bytes as they leave."""

    def __init__(self, write: Callable[[_Bytes], object], compression: str | None):
        self._write = write
        self._compressor = _COMPRESSORS[compression]() if compression else None
        self._pending: list[_Bytes] = []
        self._pending_size = 0
        self.tar_bytes = 0
        """Uncompressed tar bytes so far."""
        self.file_bytes = 0
        """Bytes handed to the destination so far (compressed when compressing)."""
        self.sha256 = hashlib.sha256()

    def add(self, data: _Bytes) -> None:
        self.tar_bytes += len(data)
        if len(data) >= _FLUSH_AT:  # large payloads go out without being copied
            self.flush()
            self._send(data)
            return
        self._pending.append(data)
        self._pending_size += len(data)
        if self._pending_size >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self._pending_size = 0
            self._send(data)

    def _send(self, data: _Bytes) -> None:
        self._emit(self._compressor.compress(data) if self._compressor is not None else data)

    def finish(self) -> None:
        self.flush()
        if self._compressor is not None:
            self._emit(self._compressor.flush())

    def _emit(self, data: _Bytes) -> None:
        if data:
            self.sha256.update(data)
            self.file_bytes += len(data)
            self._write(data)


def _as_payload(value: Any) -> _Bytes:
    """A field's encoded value as the bytes of its member; ValueError when it is not bytes-like."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, memoryview):
        return value.cast("B") if value.c_contiguous else value.tobytes()
    if isinstance(value, (bytes, bytearray)):
        return value
    raise ValueError(f"the value is a {type(value).__name__}, not bytes or str (what encoded fields must be)")


_W = TypeVar("_W", bound="_AllOrNothing")


class _AllOrNothing:
    """``with`` support: :meth:`close` when the block succeeds, :meth:`abort` when it raises."""

    def close(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError

    def __enter__(self: _W) -> _W:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class _FileWriter(_AllOrNothing):
    """One output file, written through :class:`_Output`: to a URL or path through a sink that
    makes the file appear only when :meth:`close` completes, or to a writable stream (left open).
    Subclasses say what ends the file (:meth:`_trailer`)."""

    def _open(self, fileobj: str | BinaryIO, compression: str | None, options: SourceOptions | None) -> None:
        self.url: str | None = None
        self._sink: Sink | None = None
        if fileobj == "-":  # standard output, as webdataset's writers (through gopen) take it
            fileobj = sys.stdout.buffer
        if isinstance(fileobj, str):
            self.url = fileobj
            self._sink = open_shard_sink(fileobj, options)
            self._out = _Output(self._sink.write, compression)
        else:
            self._out = _Output(fileobj.write, compression)
        self.closed = False

    def _trailer(self) -> bytes:
        """The bytes that end the file (after everything written)."""
        return b""

    def _put(self, chunks: Iterable[_Bytes]) -> None:
        """Write ``chunks``; if that fails (a full disk, an interrupt), discard the file and
        re-raise: what is half written is never kept."""
        try:
            for chunk in chunks:
                self._out.add(chunk)
        except BaseException:
            self.abort()
            raise

    @property
    def bytes_written(self) -> int:
        """Bytes of the output file so far (compressed size when compressing)."""
        return self._out.file_bytes

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the output file's bytes so far; of the whole file after :meth:`close`."""
        return self._out.sha256.hexdigest()

    def close(self) -> None:
        """End the file and, for a URL, make it appear under its name."""
        if self.closed:
            return
        self.closed = True
        try:
            self._out.add(self._trailer())
            self._out.finish()
            if self._sink is not None:
                self._sink.commit()
        except BaseException:
            if self._sink is not None:
                self._sink.abort()
            raise

    def abort(self) -> None:
        """Stop writing; for a URL, discard the file so nothing appears under its name."""
        if self.closed:
            return
        self.closed = True
        if self._sink is not None:
            self._sink.abort()


class TarStream:
    """What webdataset's ``TarWriter.tarstream`` (a ``tarfile.TarFile``) offers code that
    reaches into it: :meth:`addfile` writes a member into the writer's file, ``members`` is
    the list in which tarfile keeps them (wdsx keeps none, so code that empties it to bound
    memory finds it empty), and :meth:`close` ends the file as the writer's ``close`` does."""

    def __init__(self, writer: TarWriter):
        self._writer = writer
        self.members: list[tarfile.TarInfo] = []

    def addfile(self, tarinfo: tarfile.TarInfo, fileobj: BinaryIO | None = None) -> None:
        """Write the member ``tarinfo`` describes (pax headers where ustar cannot say it), its
        ``tarinfo.size`` bytes read from ``fileobj``."""
        data = b""
        if tarinfo.size:
            if fileobj is None:
                raise ValueError(
                    f"addfile({tarinfo.name!r}): a member of {tarinfo.size} bytes needs a fileobj"
                )
            data = read_exact(fileobj.read, tarinfo.size)
            if len(data) != tarinfo.size:
                raise ValueError(
                    f"addfile({tarinfo.name!r}): fileobj gave {len(data)} of {tarinfo.size} bytes"
                )
        header = tarinfo.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        self._writer.add_member(header, data)

    def close(self) -> None:
        self._writer.close()


class TarWriter(_FileWriter):
    """Write samples (dicts with a ``__key__``) as members of one tar file.

    ``fileobj`` is a URL or path (opened with :func:`~wdsx.write.partial.open_shard_sink`: the
    file appears only when :meth:`close` completes) or a writable binary stream (left open). ``format`` is
    accepted for webdataset compatibility, which ignores it too: the output is always ustar,
    with pax headers where needed. ``options`` configure remote sinks.
    """

    def __init__(
        self,
        fileobj: str | BinaryIO,
        user: str = "bigdata",
        group: str = "bigdata",
        mode: int = 0o444,
        compress: bool | str | None = None,
        encoder: bool | Mapping[str, FieldEncoder] | Callable[[dict], dict] | None = True,
        keep_meta: bool = False,
        mtime: float | None = None,
        format: Any = None,
        options: SourceOptions | None = None,
    ):
        self.user, self.group, self.mode = user, group, mode
        self.compress = compress
        self.keep_meta = keep_meta
        self.mtime = mtime
        self.encoder = make_encoder(encoder)
        self._renames = callable(encoder)
        """Whether the encoder is the user's function, which may change a sample's names."""
        self._names = NameChecker(keep_meta)
        self._headers = HeaderMaker(
            mode=mode, mtime=0 if mtime is None else int(mtime), uname=user, gname=group
        )
        self._open(fileobj, compression_for(fileobj, compress), options)
        self.count = 0
        """Samples written, as readers will count them: writes that add fields under the key
        just written join its sample, and a write with no field to write is none."""
        self._last_key: str | None = None
        self._last_fields: set[str] = set()
        """The key of the sample written last, and the fields written under it: readers group
        consecutive members of one key into one sample, so a next sample with that key may add
        fields to it, but not repeat one."""

    def write(self, obj: dict[str, Any]) -> int:
        """Write one sample; returns its payload bytes (headers and padding not counted).

        A sample that cannot be written as given is an :class:`~wdsx.codecs.encode.EncodingError`
        raised before any of its bytes is written; a failure while writing discards the file.
        """
        if self.closed:
            raise ValueError("write to a closed TarWriter")
        try:
            if self._renames:  # the names to check are those the user's encoder gives
                encoded = self.encoder(obj)
                key, members = self._names.members(encoded)
            else:
                key, members = self._names.members(obj)
                encoded = self.encoder(obj)
            fields = {field for field, _ in members}
            if key == self._last_key and not fields.isdisjoint(self._last_fields):
                field = min(fields & self._last_fields)
                raise EncodingError(
                    "the sample written just before has the same key and this field too: readers "
                    "take consecutive members of one key for one sample, which would hold the field "
                    "twice (an error on reading)",
                    key,
                    field,
                )
            chunks: list[_Bytes] = []
            total = 0
            for field, name in members:
                try:
                    payload = _as_payload(encoded[field])
                except ValueError as exn:
                    raise EncodingError(str(exn), key, field) from None
                size = len(payload)
                chunks += (self._headers.member(name, size), payload, padding(size))
                total += size
        except EncodingError as exn:
            exn.located(self.url)
            raise
        if not members:  # nothing to write: readers will see no sample (webdataset writes none too)
            return 0
        self._put(chunks)
        if key != self._last_key:  # a new sample; fields under the key just written join its sample
            self.count += 1
            self._last_key, self._last_fields = key, set()
        self._last_fields |= fields
        return total

    @functools.cached_property
    def tarstream(self) -> TarStream:
        """webdataset's ``tarstream`` attribute, for code written to reach into it
        (:class:`TarStream`)."""
        return TarStream(self)

    def add_member(self, header: bytes, data: bytes) -> None:
        """Write one member, ``header`` (complete tar header blocks) then ``data``, as is."""
        if self.closed:
            raise ValueError("write to a closed TarWriter")
        self._put([header, data, padding(len(data))])

    def _trailer(self) -> bytes:
        return end_of_archive(self._out.tar_bytes)


class ShardFile(Protocol):
    """One shard being written, as :class:`ShardWriter` drives it (a :class:`TarWriter`, or a
    writer of another shard format)."""

    count: int
    closed: bool
    """True once closed or aborted: a write that fails while writing aborts the shard."""

    def write(self, obj: Any) -> int: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    @property
    def bytes_written(self) -> int: ...

    @property
    def sha256(self) -> str: ...


def shard_is_full(count: int, size: float, maxcount: float, maxsize: float) -> bool:
    """webdataset's rule: a shard with ``count`` samples and ``size`` payload bytes takes no more."""
    return count >= maxcount or size >= maxsize


_PATTERN_HINT = "it needs one %d-style placeholder for the shard number, as in 'out/shard-%06d.tar'"


def checked_pattern(pattern: Any, start: int = 0) -> str:
    """``pattern`` (a str, or a path) as a str, once ``pattern % n`` is known to name shards
    ``start``, ``start + 1``... by different names; a ValueError naming the pattern otherwise."""
    if isinstance(pattern, os.PathLike):
        pattern = os.fspath(pattern)
    if not isinstance(pattern, str):
        raise ValueError(
            f"a shard pattern is a str, not a {type(pattern).__name__} ({pattern!r}); {_PATTERN_HINT}"
        )
    try:
        first, second = pattern % start, pattern % (start + 1)
    except (TypeError, ValueError, OverflowError) as exn:
        raise ValueError(f"shard pattern {pattern!r} cannot name shards ({exn}); {_PATTERN_HINT}") from None
    if first == second:
        raise ValueError(f"shard pattern {pattern!r} gives every shard the name {first!r}; {_PATTERN_HINT}")
    if "\0" in first + second:
        raise ValueError(f"shard pattern {pattern!r} gives names with a NUL byte; {_PATTERN_HINT}")
    return pattern


class ShardWriter(_AllOrNothing):
    """Write samples to a sequence of shards ``pattern % n``, each complete before the next starts.

    A new shard starts before a write once the current one holds ``maxcount`` samples or
    ``maxsize`` payload bytes (webdataset's rule, so the same samples split at the same
    places). Shards are opened on the first write to them, so no empty shard is ever left.
    ``pattern`` is checked here: one that cannot number shards is a ValueError naming it.
    ``post(fname)`` runs after each shard is complete. ``opener(fname)``, when given, returns
    the stream to write instead of :func:`~wdsx.sources.open_sink`; the writer closes it.

    ``manifest``: True writes the manifest at :func:`~wdsx.read.manifest.manifest_url_for_pattern`
    (except for ``pipe:`` patterns: that URL would be a command nobody wrote), a str writes it at
    that URL, False writes none. ``metadata`` (also settable as the
    ``metadata`` attribute before ``close``) adds top-level fields to it, such as ``classes``.

    A sample refused with an :class:`~wdsx.codecs.encode.EncodingError` leaves no trace: the
    writer goes on. Any other failure (a full disk, a failing ``post``) aborts the writer, as
    an exception inside ``with`` does: the shard being written is discarded, completed shards
    stay, no manifest is written and later writes are refused.
    """

    writer_type: ClassVar[Callable[..., ShardFile]] = TarWriter
    """What writes each shard (a subclass writing another format sets its own)."""

    def __init__(
        self,
        pattern: str,
        maxcount: int = 100000,
        maxsize: float = 3e9,
        post: Callable[[str], object] | None = None,
        start_shard: int = 0,
        verbose: int = 1,
        opener: Callable[[str], BinaryIO] | None = None,
        manifest: bool | str = True,
        options: SourceOptions | None = None,
        metadata: Mapping[str, Any] | None = None,
        **tarwriter_kw: Any,
    ):
        pattern = checked_pattern(pattern, start_shard)
        self.pattern = pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.verbose = verbose
        self.opener = opener
        self.options = options
        self.kw = tarwriter_kw
        self.shard = start_shard
        """Number of the next shard to open."""
        self.fname: str | None = None
        """Name of the shard being written (or last written)."""
        self.tarstream: ShardFile | None = None
        self.count = 0
        """Samples in the current shard."""
        self.size = 0
        """Payload bytes in the current shard."""
        self.total = 0
        """Samples written by this writer."""
        self.shards: list[ShardEntry] = []
        """The shards completed so far."""
        self.metadata: dict[str, Any] = dict(metadata or {})
        derived = manifest is True and not pattern.startswith("pipe:")
        self.manifest_url: str | None = (
            manifest if isinstance(manifest, str) else manifest_url_for_pattern(pattern) if derived else None
        )
        self._stream: BinaryIO | None = None
        self._aborted = False
        self._first_number = start_shard
        """The number of this run's first shard: the pattern's names below it are an earlier run's."""
        self._earlier: list[ShardEntry] = []
        """The entries of the local manifest an earlier run left, read before this run's first shard."""

    def write(self, obj: dict[str, Any]) -> int:
        """Write one sample, starting a new shard first if the current one is full."""
        if self._aborted:
            raise ValueError(f"write to a ShardWriter of {self.pattern!r} that was aborted")
        try:
            if self.tarstream is None or shard_is_full(self.count, self.size, self.maxcount, self.maxsize):
                self.next_stream()
            assert self.tarstream is not None
            size = self.tarstream.write(obj)
        except BaseException:
            if self.tarstream is None or self.tarstream.closed:  # the shard failed, not the sample
                self.abort()
            raise
        self.count += 1
        self.total += 1
        self.size += size
        return size

    @staticmethod
    def compression_named(name: str) -> str | None:
        """The compression a shard named ``name`` gets when none is asked for (told to the
        writer of a stream from ``opener``, which has no name)."""
        return compression_for(name, None)

    def next_stream(self) -> None:
        """Complete the current shard and open the next one."""
        self.finish()
        self.fname = self.pattern % self.shard
        self.shard += 1
        if self.verbose:
            log.info("# writing %s (%d samples so far)", self.fname, self.total)
        kw = dict(self.kw)
        if self.opener is not None:
            if kw.get("compress") is None:  # a stream has no name to tell, so ask the pattern's
                kw["compress"] = self.compression_named(self.fname)
            self._stream = self.opener(self.fname)
            self.tarstream = self.writer_type(self._stream, options=self.options, **kw)
        else:
            self.tarstream = self.writer_type(self.fname, options=self.options, **kw)
        self.count = 0
        self.size = 0

    def finish(self) -> None:
        """Complete the current shard, if any: close it, record it, run ``post``."""
        if self.tarstream is None:
            return
        writer, self.tarstream = self.tarstream, None
        if writer.count == 0:  # every sample offered to it was refused: no empty shard
            writer.abort()
            self._close_stream()
            self.shard -= 1
            return
        if not self.shards:
            self._retire_earlier_manifest(posixpath.basename(self.fname or ""))
        writer.close()
        self._close_stream()
        assert self.fname is not None
        self.shards.append(
            ShardEntry(posixpath.basename(self.fname), writer.count, writer.bytes_written, writer.sha256)
        )
        if self.post is not None:
            self.post(self.fname)

    def close(self) -> None:
        """Complete the last shard and write the manifest (when there is something to list);
        nothing after :meth:`abort`. If this fails, the writer is aborted."""
        if self._aborted:
            return
        try:
            self.finish()
            if self.manifest_url is not None and self.shards:
                shards = self._still_listed() + self.shards
                self._write_manifest(Manifest(shards, dict(self.metadata)).to_json().encode("utf-8"))
        except BaseException:
            self.abort()
            raise

    def _retire_earlier_manifest(self, shard: str) -> None:
        """Remove the manifest an earlier run left where this one writes its own, when it
        lists ``shard``, which this run's first shard is about to replace: should this run
        fail, readers then find no manifest rather than one that no longer describes the
        shards (they would trust its counts). Only a local manifest that this writer writes
        itself (not through ``opener``) is removed; readers refuse a shard that holds more
        samples than a manifest left in place says."""
        path = local_path(self.manifest_url) if self.manifest_url is not None else None
        if path is None or self.opener is not None:
            return
        try:
            earlier = Manifest.load(path)
        except ValueError:  # not a manifest any reader could use either
            earlier = None
        else:
            self._earlier = earlier.shards if earlier is not None else []
            if earlier is None or shard not in {entry.name for entry in earlier.shards}:
                return
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        log.info("removed %s, an earlier run's manifest: this run writes its own when it completes", path)

    def _still_listed(self) -> list[ShardEntry]:
        """The entries of the earlier run's manifest for the shards before this run's first
        one that are still beside it: appending shards (``start_shard``) keeps them listed.
        Shards an earlier, longer run left after this run's are not listed: ``wdsx verify``
        then names them, for they are no part of what this run wrote."""
        before = {posixpath.basename(self.pattern % number) for number in range(self._first_number)}
        folder = os.path.dirname(local_path(self.manifest_url or "") or "")
        return [
            entry
            for entry in self._earlier
            if entry.name in before and os.path.isfile(os.path.join(folder, entry.name))
        ]

    def _write_manifest(self, data: bytes) -> None:
        assert self.manifest_url is not None
        if self.opener is None:
            write_whole(self.manifest_url, data, self.options)
            return
        stream = self.opener(self.manifest_url)
        try:
            stream.write(data)
        finally:
            stream.close()

    def abort(self) -> None:
        """Discard the shard being written (completed shards stay) and write no manifest."""
        self._aborted = True
        if self.tarstream is not None:
            self.tarstream.abort()
            self.tarstream = None
        self._close_stream()

    def _close_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()
