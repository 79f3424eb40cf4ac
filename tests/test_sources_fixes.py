"""Sources that lost data or ran without bound in corner cases: bytes read ahead before an error,
a cached download of a reply longer than its recorded size, URLs of a registered ``name:``
scheme taken for local paths.

Servers are the loopback ones of :mod:`tests.fixtures.hostile`; the oracle for a tar's samples
is Python's tarfile on the bytes the manifest records.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tarfile
from pathlib import Path

import pytest

import wdsx
from tests.fixtures.hostile import HostileHTTPServer, endless, serve
from tests.fixtures.servers import random_bytes, wait_until
from tests.fixtures.shards import tar_bytes
from wdsx.errors import SourceError
from wdsx.read.manifest import Manifest, ShardEntry
from wdsx.sources import (
    LocalSource,
    SourceOptions,
    list_shards,
    local_path,
    missing_local_shards,
    names_several,
    open_source,
    register,
    registered,
    unregister,
)
from wdsx.sources.base import Source
from wdsx.sources.cache import LOCK, PART, cache_path, open_cached, try_lock
from wdsx.sources.prefetch import Prefetcher

SHARDS = {
    "train-000000.tar": tar_bytes(
        [(f"a{i:03d}.{ext}", f"{ext} {i}".encode()) for i in range(5) for ext in ("txt", "cls")]
    ),
    "train-000001.tar": tar_bytes([(f"b{i:03d}.bin", random_bytes(8000, seed=i)) for i in range(3)]),
}
PATIENT = SourceOptions(retries=1, backoff=0.0)
"""Default chunk size (the whole of each small shard fits in one read-ahead chunk), one retry."""


def oracle_keys(data: bytes) -> list[str]:
    """Sample keys of a tar, by Python's tarfile."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return list(dict.fromkeys(name.split(".", 1)[0] for name in archive.getnames()))


def past_the_size(url: str, size: int) -> str:
    """The error a stream that runs past its recorded size ends in."""
    return f"{url}: the stream goes on past byte {size}, the shard's recorded size"


def read_until_error(source: Source, size: int = 1 << 16) -> tuple[bytes, SourceError]:
    """The bytes a source returned before it raised, and what it raised."""
    received = bytearray()
    try:
        while part := source.read(size):
            received += part
    except SourceError as exn:
        return bytes(received), exn
    raise AssertionError(f"the read ended without an error after {len(received)} bytes")


def route_overrunning(server: HostileHTTPServer) -> list[str]:
    """Serve each of :data:`SHARDS` under ``d/``, followed by zero bytes without end and no
    ``Content-Length``, beside a manifest recording each one's true size; their URLs."""
    entries = []
    for name, data in SHARDS.items():
        server.route(f"d/{name}", endless(data, bytes(1 << 16)))
        entries.append(ShardEntry(name, len(oracle_keys(data)), len(data)))
    server.route("d/train.manifest.json", serve(Manifest(entries).to_json().encode()))
    return [server.url(f"d/{name}") for name in SHARDS]


# ----------------------------------------------------------------------------- prefetching


@pytest.mark.timeout(30)
def test_bytes_read_ahead_before_an_error_are_delivered_then_the_error(hostile_http):
    url = route_overrunning(hostile_http)[0]
    data = SHARDS["train-000000.tar"]
    with Prefetcher(PATIENT) as prefetcher:
        prefetcher.schedule(url, 0, size=len(data))
        with prefetcher.open(url, 0, size=len(data)) as source:
            received, error = read_until_error(source)
            assert received == data
            assert str(error) == past_the_size(url, len(data))
            with pytest.raises(SourceError, match=re.escape(past_the_size(url, len(data)))):
                source.read(1)  # the error stays: an end of stream would pass for a complete shard


@pytest.mark.timeout(30)
def test_a_prefetched_shard_longer_than_its_manifest_keeps_its_samples(hostile_http, caplog):
    """The second shard is read ahead while the first is read: with the default chunk size it
    fits in one chunk, and the overrun after it must not take its samples away."""
    urls = route_overrunning(hostile_http)
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        dataset = wdsx.WebDataset(urls, shardshuffle=False, handler=wdsx.warn_and_continue, options=PATIENT)
        keys = [sample["__key__"] for sample in dataset]
    assert keys == [key for data in SHARDS.values() for key in oracle_keys(data)]
    warned = "\n".join(record.getMessage() for record in caplog.records)
    for url, data in zip(urls, SHARDS.values()):
        assert past_the_size(url, len(data)) in warned


# ----------------------------------------------------------------------------- cache


def cache_left(cache_dir: str) -> list[str]:
    """What a finished download leaves in the cache besides its lock file."""
    return sorted(name for name in os.listdir(cache_dir) if not name.endswith(LOCK))


def download_finished(cache_dir: str, url: str) -> bool:
    """Whether no one holds the download lock of ``url`` any more."""
    lock = try_lock(cache_path(cache_dir, url) + LOCK)
    if lock is None:
        return False
    os.close(lock)
    return True


def assert_download_refused(url: str, size: int, source: Source, cache_dir: str) -> None:
    """``source`` gives some of the recorded bytes (all of them, or fewer when the download
    failed before the reader caught up with it), then the overrun's error; the download stops
    and keeps nothing."""
    received, error = read_until_error(source)
    assert SHARDS["train-000000.tar"][:size].startswith(received)
    assert str(error) == past_the_size(url, size)
    assert not any(name.endswith(PART) for name in os.listdir(cache_dir)), "the partial copy was deleted"
    wait_until(lambda: download_finished(cache_dir, url), 10, "the download's end")
    assert cache_left(cache_dir) == []


@pytest.mark.timeout(30)
def test_a_cached_download_stops_at_the_recorded_size(hostile_http, tmp_path):
    url = route_overrunning(hostile_http)[0]
    size = len(SHARDS["train-000000.tar"])
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), retries=1, backoff=0.0)
    http = registered("http")
    assert http is not None and http.opener is not None
    with open_cached(url, 0, options, http.opener, size=size) as source:
        assert_download_refused(url, size, source, str(options.cache_dir))


@pytest.mark.timeout(30)
def test_a_recorded_size_bounds_the_cache_download_of_an_endless_reply(hostile_http, tmp_path):
    """Through :func:`open_source`: the reader and the download behind it both stop at ``size``."""
    url = route_overrunning(hostile_http)[0]
    size = len(SHARDS["train-000000.tar"])
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), retries=1, backoff=0.0)
    with open_source(url, 0, options, size=size) as source:
        assert_download_refused(url, size, source, str(options.cache_dir))
    # A reader opened again downloads again, and stops at the same byte.
    with open_source(url, 0, options, size=size) as source:
        assert_download_refused(url, size, source, str(options.cache_dir))


# ----------------------------------------------------------------------------- registered schemes


@pytest.fixture
def mine(tmp_path: Path):
    """The scheme ``mine``: ``mine:/NAME`` is the file NAME under a directory of two shards, with
    a lister. Unregistered afterwards."""
    store = tmp_path / "store"
    (store / "d").mkdir(parents=True)
    for name, data in SHARDS.items():
        (store / "d" / name).write_bytes(data)

    def opener(url: str, offset: int, options: SourceOptions) -> Source:
        return LocalSource(url, str(store / url.removeprefix("mine:/")), offset)

    def lister(prefix: str, options: SourceOptions) -> list[str]:
        names = (path.relative_to(store).as_posix() for path in store.rglob("*") if path.is_file())
        return [f"mine:/{name}" for name in names if f"mine:/{name}".startswith(prefix)]

    assert registered("mine") is None
    register("mine", opener, lister=lister)
    try:
        yield store
    finally:
        unregister("mine")


def test_a_registered_scheme_without_slashes_is_not_a_local_path(mine):
    assert local_path("mine:/d/train-000000.tar") is None
    assert local_path("Mine:d/x.tar") is None
    # Names whose prefix is no registered scheme stay paths.
    assert local_path("C:/data/x.tar") == "C:/data/x.tar"
    assert local_path("train:v2.tar") == "train:v2.tar"
    assert local_path("file:/x.tar") == "/x.tar"


def test_a_registered_scheme_is_listed_and_checked_by_its_store(mine):
    urls = [f"mine:/d/{name}" for name in SHARDS]
    assert missing_local_shards([*urls, "mine:/d/absent.tar"]) == []
    assert names_several("mine:/d/") and names_several("mine:/d/train-*.tar")
    assert not names_several(urls[0])
    assert list_shards("mine:/d/") == urls
    assert list_shards("mine:/d/train-*1.tar") == urls[1:]
    keys = [sample["__key__"] for sample in wdsx.WebDataset("mine:/d/", shardshuffle=False)]
    assert keys == [key for data in SHARDS.values() for key in oracle_keys(data)]
    with pytest.raises(SourceError, match="absent"):
        list(wdsx.WebDataset("mine:/d/absent.tar", shardshuffle=False))


def test_a_colon_name_is_a_local_path_while_no_scheme_has_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine:").mkdir()
    (tmp_path / "mine:" / "x.tar").write_bytes(SHARDS["train-000000.tar"])
    assert registered("mine") is None
    assert local_path("mine:/x.tar") == "mine:/x.tar"
    assert missing_local_shards(["mine:/x.tar", "mine:/y.tar"]) == ["mine:/y.tar"]
    assert names_several("mine:/") and list_shards("mine:/") == ["mine:/x.tar"]
    keys = [sample["__key__"] for sample in wdsx.WebDataset("mine:/", shardshuffle=False)]
    assert keys == oracle_keys(SHARDS["train-000000.tar"])
