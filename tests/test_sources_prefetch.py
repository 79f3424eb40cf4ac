"""Prefetcher: the next shard is opened and its head buffered in the background, within bounds."""

from __future__ import annotations

import threading
import tracemalloc

import pytest

from tests.fixtures.servers import random_bytes, read_all, wait_until
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions
from wdsx.sources.prefetch import Prefetcher

MiB = 1 << 20
SHARDS = {f"prefetch-{n}.tar": random_bytes(4 * MiB + n, seed=50 + n) for n in range(3)}
OPTIONS = SourceOptions(chunk=64 << 10, prefetch=2)


@pytest.fixture(scope="module")
def names(http_server):
    for name, data in SHARDS.items():
        http_server.add(name, data)
    return list(SHARDS)


@pytest.fixture
def proxy(fault_proxy, http_server):
    return fault_proxy(http_server.port)


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("wdsx-prefetch")]


def test_scheduled_shards_read_the_same_bytes_and_buffer_a_bounded_head(proxy, names):
    with Prefetcher(OPTIONS) as prefetcher:
        tracemalloc.start()
        try:
            prefetcher.schedule(f"{proxy.url}/{names[0]}")
            prefetcher.schedule(f"{proxy.url}/{names[1]}", 1000)
            wait_until(lambda: not prefetch_threads(), 10, "prefetching")
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(proxy.gets()) == 2, "both opened before they were asked for"
        assert held < 2 * MiB, f"{held} bytes held: a bounded head (2 x 4 x 64 KiB), not whole shards"
        with prefetcher.open(f"{proxy.url}/{names[1]}", 1000) as source:
            assert read_all(source, 10_000) == SHARDS[names[1]][1000:]
        with prefetcher.open(f"{proxy.url}/{names[0]}") as source:
            assert read_all(source, 100_000) == SHARDS[names[0]]
        assert len(proxy.gets()) == 2


def test_unscheduled_or_local_shards_open_directly(proxy, names, tmp_path):
    local = tmp_path / "local.tar"
    local.write_bytes(SHARDS[names[2]])
    with Prefetcher(OPTIONS) as prefetcher:
        prefetcher.schedule(str(local))
        assert not prefetch_threads()
        with prefetcher.open(str(local)) as source:
            assert read_all(source) == SHARDS[names[2]]
        prefetcher.schedule(f"{proxy.url}/{names[0]}")
        with prefetcher.open(f"{proxy.url}/{names[0]}", 5) as source:
            assert read_all(source) == SHARDS[names[0]][5:]


def test_no_more_than_options_prefetch_shards_are_scheduled(proxy, names):
    with Prefetcher(SourceOptions(prefetch=1)) as prefetcher:
        for name in names:
            prefetcher.schedule(f"{proxy.url}/{name}")
        wait_until(lambda: not prefetch_threads(), 10, "prefetching")
        assert len(proxy.gets()) == 1


def test_open_raises_what_prefetching_raised(proxy):
    with Prefetcher(OPTIONS) as prefetcher:
        prefetcher.schedule(f"{proxy.url}/absent.tar")
        with pytest.raises(SourceError, match="HTTP 404"):
            prefetcher.open(f"{proxy.url}/absent.tar")


def test_close_cancels_and_leaves_no_thread_or_connection(proxy, names):
    proxy.hold(at_bytes=100_000)
    prefetcher = Prefetcher(OPTIONS)
    for name in names[:2]:
        prefetcher.schedule(f"{proxy.url}/{name}")
    wait_until(lambda: len(proxy.gets()) == 2, 10, "both requests")
    proxy.release()
    prefetcher.close()
    assert not prefetch_threads()
    wait_until(lambda: proxy.open_connections() == 0, 10, "connections closed")
    prefetcher.schedule(f"{proxy.url}/{names[0]}")
    assert not prefetch_threads(), "a closed prefetcher schedules nothing"
