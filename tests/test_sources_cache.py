"""The local shard cache, with remote reads going through a proxy that counts every GET."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal

import pytest

from tests.fixtures.servers import random_bytes, read_all, read_exactly
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, open_source
from wdsx.sources.cache import PART, cache_path

pytestmark = pytest.mark.slow  # a real S3 server

MiB = 1 << 20
DATA = random_bytes(3 * MiB + 5, seed=41)
FORK = multiprocessing.get_context("fork")


@pytest.fixture(scope="module")
def shard_name(http_server):
    http_server.add("cached-shard.tar", DATA)
    return "cached-shard.tar"


@pytest.fixture
def proxy(fault_proxy, http_server):
    return fault_proxy(http_server.port)


@pytest.fixture
def options(tmp_path):
    return SourceOptions(cache_dir=str(tmp_path / "cache"), chunk=256 << 10, timeout=30)


def cached_files(options):
    """The complete copies in the cache, by name, with their sizes."""
    names = [n for n in os.listdir(options.cache_dir) if not n.endswith((PART, ".lock"))]
    return {name: os.path.getsize(os.path.join(options.cache_dir, name)) for name in names}


def test_second_open_reads_from_the_cache(proxy, shard_name, options):
    url = f"{proxy.url}/{shard_name}"
    with open_source(url, 0, options) as source:
        assert read_all(source) == DATA
    with open_source(url, 1_234_567, options) as source:
        assert source.local_path == cache_path(options.cache_dir, url)
        assert read_all(source) == DATA[1_234_567:]
    assert len(proxy.gets()) == 1
    with open(cache_path(options.cache_dir, url), "rb") as copy:
        assert copy.read() == DATA


def test_reading_while_the_shard_downloads(proxy, shard_name, options):
    url = f"{proxy.url}/{shard_name}"
    proxy.hold(at_bytes=MiB)
    first = open_source(url, 0, options)
    assert read_exactly(first, 512 << 10) == DATA[: 512 << 10]
    second = open_source(url, 100_000, options)
    assert read_exactly(second, 256 << 10) == DATA[100_000 : 100_000 + (256 << 10)]
    final = cache_path(options.cache_dir, url)
    assert not os.path.exists(final) and os.path.exists(final + PART), "the download is still held"
    proxy.release()
    assert DATA[: 512 << 10] + read_all(first) == DATA
    assert DATA[100_000 : 100_000 + (256 << 10)] + read_all(second) == DATA[100_000:]
    first.close()
    second.close()
    assert len(proxy.gets()) == 1
    assert os.path.getsize(final) == len(DATA)


def _read_through_cache(url, options, ready, results):
    with open_source(url, 0, options) as source:
        head = read_exactly(source, 512 << 10)
        ready.put(os.getpid())
        results.put(hashlib.sha256(head + read_all(source)).hexdigest())


def test_concurrent_processes_download_a_shard_once(proxy, shard_name, options):
    url = f"{proxy.url}/{shard_name}"
    proxy.hold(at_bytes=MiB)
    ready, results = FORK.Queue(), FORK.Queue()
    workers = [
        FORK.Process(target=_read_through_cache, args=(url, options, ready, results)) for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            ready.get(timeout=30)
        proxy.release()
        digests = [results.get(timeout=30) for _ in workers]
    finally:
        proxy.release()
        for worker in workers:
            worker.join(timeout=30)
    assert digests == [hashlib.sha256(DATA).hexdigest()] * 2
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert len(proxy.gets()) == 1


def _download_then_hang(url, options, ready):
    source = open_source(url, 0, options)
    source.read(100_000)
    ready.put(os.getpid())
    signal.pause()


def test_a_reader_takes_over_when_the_downloading_process_dies(proxy, shard_name, options):
    url = f"{proxy.url}/{shard_name}"
    proxy.hold(at_bytes=MiB)
    ready = FORK.Queue()
    downloader = FORK.Process(target=_download_then_hang, args=(url, options, ready))
    downloader.start()
    try:
        ready.get(timeout=30)
        with open_source(url, 0, options) as follower:
            head = read_exactly(follower, 512 << 10)
            os.kill(downloader.pid, signal.SIGKILL)
            downloader.join(timeout=30)
            proxy.release()
            assert head + read_all(follower) == DATA
    finally:
        proxy.release()
        downloader.kill()
        downloader.join(timeout=30)
    assert len(proxy.gets()) == 2
    assert cached_files(options) == {os.path.basename(cache_path(options.cache_dir, url)): len(DATA)}


def test_eviction_keeps_the_least_recently_used_out(http_server, proxy, options, tmp_path):
    shards = {}
    for name in "abcd":
        shards[name] = random_bytes(MiB, seed=ord(name))
        http_server.add(f"lru-{name}.tar", shards[name])
    options = SourceOptions(cache_dir=options.cache_dir, cache_size=int(2.5 * MiB))

    def read(name):
        with open_source(f"{proxy.url}/lru-{name}.tar", 0, options) as source:
            assert read_all(source) == shards[name]
        assert sum(cached_files(options).values()) <= options.cache_size

    def cached():
        return sorted(n[-5] for n in cached_files(options))

    read("a")
    read("b")
    read("a")
    read("c")
    assert cached() == ["a", "c"], "b was used less recently than a"
    read("d")
    assert cached() == ["c", "d"]
    assert len(proxy.gets()) == 4


def test_downloads_finishing_together_stay_within_the_bound(http_server, options, monkeypatch):
    """Four downloads (as prefetching starts them) that finish at once each make room for
    themselves before they move in: the copies never total more than the bound, however
    their steps interleave (each move-in is slowed down here, to widen the window in which
    another download could make room as if it had not happened)."""
    import threading
    import time

    from wdsx.sources import cache

    for name in "efgh":
        http_server.add(f"together-{name}.tar", random_bytes(MiB, seed=ord(name)))
    options = SourceOptions(cache_dir=options.cache_dir, cache_size=int(2.5 * MiB))
    rename = os.rename

    def slow_rename(source: str, target: str) -> None:
        time.sleep(0.2)
        rename(source, target)

    monkeypatch.setattr(cache.os, "rename", slow_rename)

    def read(name: str) -> None:
        with open_source(f"{http_server.url(f'together-{name}.tar')}", 0, options) as source:
            read_all(source)

    readers = [threading.Thread(target=read, args=(name,)) for name in "efgh"]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    assert sum(cached_files(options).values()) <= options.cache_size


def test_same_basename_in_two_buckets_gets_two_entries(s3_server, fault_proxy, options):
    proxy = fault_proxy(s3_server.port)
    via_proxy = s3_server.options_via(proxy.url, cache_dir=options.cache_dir)
    contents = {}
    for seed in (1, 2):
        bucket = s3_server.new_bucket("collide")
        contents[f"s3://{bucket}/x/shard-000.tar"] = random_bytes(200_000, seed=seed)
        s3_server.client().put_object(
            Bucket=bucket, Key="x/shard-000.tar", Body=contents[f"s3://{bucket}/x/shard-000.tar"]
        )
    for _ in range(2):
        for url, data in contents.items():
            with open_source(url, 0, via_proxy) as source:
                assert read_all(source) == data
    assert len(proxy.gets()) == 2
    names = list(cached_files(options))
    assert len(names) == 2 and all(name.endswith("-shard-000.tar") for name in names)


def test_sha256_is_checked(proxy, shard_name, options):
    url = f"{proxy.url}/{shard_name}"
    good = hashlib.sha256(DATA).hexdigest()
    with open_source(url, 0, options, sha256=good) as source:
        assert read_all(source) == DATA
    bad = hashlib.sha256(b"something else").hexdigest()
    with open_source(url, 0, options, sha256=bad) as source:
        with pytest.raises(SourceError, match=f"sha256 mismatch: expected {bad}") as caught:
            read_all(source)
    assert caught.value.url == url
    assert not os.path.exists(cache_path(options.cache_dir, url, bad))
    assert not os.path.exists(cache_path(options.cache_dir, url, bad) + PART)
    assert list(cached_files(options)) == [os.path.basename(cache_path(options.cache_dir, url, good))]


def test_missing_shard_is_reported_at_open(proxy, options):
    with pytest.raises(SourceError, match="HTTP 404"):
        open_source(f"{proxy.url}/absent.tar", 0, options)
    assert cached_files(options) == {}


def test_a_child_forked_while_a_download_moves_in_can_use_the_cache(tmp_path, monkeypatch):
    """A process forked (a DataLoader worker) while a download thread holds the lock on moving
    copies in does not keep that lock: its own downloads, and the parent's, move in."""
    import signal
    import threading

    from wdsx.sources import cache
    from wdsx.sources.local import LocalSource

    for name in "abc":
        (tmp_path / f"{name}.bin").write_bytes(random_bytes(100_000, seed=ord(name)))
    options = SourceOptions(cache_dir=str(tmp_path / "cache"), cache_size=10**9)

    def opener(url: str, offset: int, _options: SourceOptions) -> LocalSource:
        return LocalSource(url, url.removeprefix("remote://"), offset)

    inside, forked = threading.Event(), threading.Event()
    evict = cache.evict

    def evict_once_forked(*args, **kwargs):  # the first download waits here, holding the lock
        if not forked.is_set():
            inside.set()
            forked.wait(30)
        return evict(*args, **kwargs)

    monkeypatch.setattr(cache, "evict", evict_once_forked)

    def fetch(name: str) -> None:
        url = f"remote://{tmp_path}/{name}.bin"
        with cache.open_cached(url, 0, options, opener) as source:
            read_all(source)
        while not os.path.exists(cache.cache_path(options.cache_dir, url)):  # moved in
            threading.Event().wait(0.01)

    first = cache.open_cached(f"remote://{tmp_path}/a.bin", 0, options, opener)
    assert inside.wait(30)
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's outcome is its exit status
        signal.alarm(20)
        forked.set()
        fetch("b")
        os._exit(0)
    forked.set()
    read_all(first)
    first.close()
    fetch("c")
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child could not move its download in"
