"""URLs of other fsspec protocols: ``memory://``, and ``flakymem://``, an in-memory filesystem
defined here whose reads fail now and then and which records every read it serves (the
server-side oracle: where each read started and how many bytes it delivered)."""

from __future__ import annotations

import errno
import io
import os
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

import wdsx
from tests.fixtures.servers import read_all
from tests.fixtures.shards import Shards, make_shards
from tests.test_remote_pipeline import local_samples, strip
from wdsx.errors import SourceError
from wdsx.read.samples import POSITION
from wdsx.sources import SourceOptions, list_shards, open_source

COUNTS = [30, 12, 25, 7, 30, 19, 22, 11]


class FlakyMemoryFileSystem(MemoryFileSystem):
    """``flakymem://``: every ``fail_every``-th read raises a connection reset, delivering nothing."""

    protocol = "flakymem"
    store: dict[str, Any] = {}
    pseudo_dirs = [""]
    fail_every = 0
    calls = 0
    failures = 0
    reads: list[tuple[str, int, int]] = []
    """``(path, position, bytes delivered)`` of every read that succeeded, in order."""

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return MemoryFileSystem._strip_protocol(path.replace("flakymem://", "memory://", 1))

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        handle = super()._open(path, mode, **kwargs)
        return _FlakyFile(self._strip_protocol(path), handle.getvalue()) if mode == "rb" else handle


class _FlakyFile(io.BytesIO):
    def __init__(self, path: str, data: bytes):
        super().__init__(data)
        self.path = path

    def read(self, n: int | None = -1) -> bytes:
        flaky = FlakyMemoryFileSystem
        flaky.calls += 1
        if flaky.fail_every and flaky.calls % flaky.fail_every == 0:
            flaky.failures += 1
            raise ConnectionResetError(errno.ECONNRESET, "connection reset by the test filesystem")
        position = self.tell()
        data = super().read(n)
        flaky.reads.append((self.path, position, len(data)))
        return data


fsspec.register_implementation("flakymem", FlakyMemoryFileSystem, clobber=True)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    return make_shards(str(tmp_path_factory.mktemp("fsspec")), COUNTS, payload=3000)


def upload(protocol: str, directory: str, shards: Shards) -> list[str]:
    fs = fsspec.filesystem(protocol)
    urls = []
    for path in shards.urls:
        with open(path, "rb") as stream:
            url = f"{protocol}://{directory}/{os.path.basename(path)}"
            fs.pipe(url, stream.read())
            urls.append(url)
    return urls


@pytest.fixture
def flaky():
    FlakyMemoryFileSystem.fail_every = 0
    FlakyMemoryFileSystem.calls = FlakyMemoryFileSystem.failures = 0
    FlakyMemoryFileSystem.reads = []
    yield FlakyMemoryFileSystem
    FlakyMemoryFileSystem.store.clear()
    FlakyMemoryFileSystem.fail_every = 0


def samples(urls: list[str], options: SourceOptions) -> list[dict]:
    return [strip(sample) for sample in wdsx.WebDataset(urls, options=options, manifest=False)]


def test_memory_pipeline_prefix_glob_and_cache(local, tmp_path):
    urls = upload("memory", "wdsx-tests/train", local)
    fsspec.filesystem("memory").pipe("memory://wdsx-tests/train/notes.txt", b"not a shard")
    try:
        assert samples(urls, SourceOptions()) == local_samples(local.urls)
        cached = SourceOptions(cache_dir=str(tmp_path / "cache"), prefetch=2)
        assert samples(urls, cached) == local_samples(local.urls)
        assert len(os.listdir(tmp_path / "cache")) >= len(urls)
        assert list_shards("memory://wdsx-tests/train/") == urls
        assert list_shards("memory://wdsx-tests/train/shard-00000[2-4].tar") == urls[2:5]
        assert list_shards("memory://wdsx-tests/nothing/") == []
        dataset = wdsx.WebDataset("memory://wdsx-tests/train/", manifest=False)
        assert dataset.urls == urls
    finally:
        fsspec.filesystem("memory").rm("memory://wdsx-tests", recursive=True)


def test_failed_reads_continue_at_the_last_byte_delivered(local, flaky):
    urls = upload("flakymem", "data", local)
    flaky.fail_every = 7
    options = SourceOptions(chunk=4096, retries=50, backoff=0.001)
    assert samples(urls, options) == local_samples(local.urls)
    assert flaky.failures > 10
    for url, path in zip(urls, local.urls, strict=True):
        served = [
            (position, size) for name, position, size in flaky.reads if name == url[len("flakymem:/") :]
        ]
        assert served[0][0] == 0 and sum(size for _, size in served) <= os.path.getsize(path)
        assert all(a + n == b for (a, n), (b, _) in zip(served, served[1:])), (
            "each read starts where the last ended"
        )


def test_resume_reads_from_the_checkpoint_offset(local, flaky):
    urls = upload("flakymem", "resume", local)
    options = SourceOptions(prefetch=0)
    first = wdsx.WebDataset(urls, options=options, manifest=False)
    iterator = iter(first)
    for _ in range(40):
        next(iterator)
    state = first.state_dict()
    expected = next(iterator)
    offset = expected[POSITION][1]
    assert offset > 0
    flaky.reads = []
    resumed = wdsx.WebDataset(urls, options=options, manifest=False)
    resumed.load_state_dict(state)
    assert strip(next(iter(resumed))) == strip(expected)
    assert flaky.reads[0][:2] == ("/resume/shard-000001.tar", offset)


def test_errors_name_the_url(flaky):
    fsspec.filesystem("flakymem").pipe("flakymem://errors/a.tar", b"x" * 10)
    with pytest.raises(SourceError, match="FileNotFoundError") as caught:
        open_source("flakymem://errors/missing.tar", 0)
    assert caught.value.url == "flakymem://errors/missing.tar"
    with pytest.raises(SourceError, match="offset 11 is past the end of the file \\(10 bytes\\)"):
        open_source("flakymem://errors/a.tar", 11)
    with open_source("flakymem://errors/a.tar", 10) as source:
        assert read_all(source) == b""
    with pytest.raises(SourceError, match="no reader for URL scheme 'nosuchprotocol'"):
        open_source("nosuchprotocol://bucket/a.tar", 0)
