"""What every object store must do, against GCS (fake-gcs-server), Azure (Azurite) and the
Hugging Face Hub (a local Hub server): each test runs once per store (the ``store`` fixture;
``writable_store`` for GCS and Azure, which wdsx also writes to).

The oracles are the local copies of the shards (read by the same pipeline from disk), the
store's own client library, and what a proxy in front of the store saw: each request, its
``Range`` header, and the bytes it forwarded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import wdsx
from tests.fixtures.servers import random_bytes, read_all
from tests.fixtures.shards import Shards, make_shards
from tests.fixtures.stores import ROOT
from tests.test_convert import _make_folder, _shards
from tests.test_remote_pipeline import local_samples, strip
from wdsx.read.samples import POSITION
from wdsx.sources import list_shards, open_sink, open_source
from wdsx.write.convert import ConvertSettings, convert

pytestmark = pytest.mark.slow  # real storage emulators (GCS, Azurite, a Hub server)

MiB = 1 << 20
COUNTS = [30, 12, 25, 7, 30, 19, 22, 11]
WRITER = """
import json, os, sys
import wdsx
writer = wdsx.TarWriter(sys.argv[1], options=wdsx.SourceOptions(**json.loads(sys.argv[2])))
for index in range(int(sys.argv[3])):
    writer.write({"__key__": f"{index:06d}", "bin": os.urandom(1 << 20)})
print("written", flush=True)
sys.stdin.read()
"""
"""Writes MiB-sized samples to a shard at a URL, says so, and waits (to be killed)."""


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    """Eight shards on disk: the copies every store's reads are compared with."""
    return make_shards(str(tmp_path_factory.mktemp("stores")), COUNTS, payload=3000)


def upload(store, shards: Shards, folder: str = "train") -> list[str]:
    """Put the shards under ``folder/`` in the store; their URLs, in shard order."""
    urls = []
    for path in shards.urls:
        with open(path, "rb") as stream:
            urls.append(store.put(f"{folder}/{os.path.basename(path)}", stream.read()))
    return urls


def samples(urls: list[str], options) -> list[dict]:
    return [strip(sample) for sample in wdsx.WebDataset(urls, options=options, manifest=False)]


@pytest.mark.parametrize("offset", [0, 1, 1_000_003, 2_000_004, 2_000_005])
def test_read_from_an_offset_is_one_ranged_get(store, fault_proxy, offset):
    data = random_bytes(2_000_005, seed=5)
    url = store.put("data/one.tar", data)
    proxy = fault_proxy(store.port)
    with open_source(url, offset, store.options_via(proxy.url)) as source:
        assert source.local_path is None and source.seekable
        assert read_all(source) == data[offset:]
    first = proxy.gets("one.tar")[0]
    assert first.range == (f"bytes={offset}-" if offset else None)


def test_pipeline_over_eight_shards_reads_what_the_local_copies_hold(store, local):
    urls = upload(store, local)
    assert samples(urls, store.options) == local_samples(local.urls)


def test_prefix_and_glob_list_the_shards(store, local):
    urls = upload(store, local)
    store.put("train/notes.txt", b"not a shard")
    store.put("other/shard-000000.tar", b"elsewhere")
    assert list_shards(store.prefix + "train/", store.options) == urls
    assert list_shards(store.prefix + "train/shard-00000[0-3].tar", store.options) == urls[:4]
    assert list_shards(store.prefix + "*/shard-000000.tar", store.options) == sorted(
        [urls[0], store.prefix + "other/shard-000000.tar"]
    )
    assert list_shards(store.prefix + "nothing-here/", store.options) == []
    dataset = wdsx.WebDataset(store.prefix + "train/", options=store.options, manifest=False)
    assert dataset.urls == urls


def test_resume_reads_from_the_checkpoint_offset_with_one_ranged_get(store, fault_proxy, local):
    urls = upload(store, local)
    first = wdsx.WebDataset(urls, options=store.options_via(store.endpoint_url, prefetch=0), manifest=False)
    iterator = iter(first)
    for _ in range(40):
        next(iterator)
    state = first.state_dict()
    expected = next(iterator)
    shard, offset = expected[POSITION][:2]
    assert offset > 0

    proxy = fault_proxy(store.port)
    resumed = wdsx.WebDataset(urls, options=store.options_via(proxy.url, prefetch=0), manifest=False)
    resumed.load_state_dict(state)
    assert strip(next(iter(resumed))) == strip(expected)
    name = os.path.basename(local.urls[1])
    assert [request.range for request in proxy.gets(name)] == [f"bytes={offset}-"]


@pytest.mark.parametrize("seed", [1, 2])
def test_cut_connections_give_the_same_samples_for_at_most_ten_percent_more_bytes(
    store, fault_proxy, local, seed
):
    urls = upload(store, local)
    proxy = fault_proxy(store.port, seed=seed, cut_after=(20_000, 90_000))
    options = store.options_via(proxy.url, retries=50, backoff=0.001)
    assert samples(urls, options) == local_samples(local.urls)
    size = sum(os.path.getsize(path) for path in local.urls)
    assert proxy.cuts > 0
    assert proxy.bytes_down <= 1.1 * size, f"fetched {proxy.bytes_down} bytes for {size}"


def test_loader_workers_with_cache_and_prefetch_fetch_each_shard_once(store, fault_proxy, local, tmp_path):
    urls = upload(store, local)
    proxy = fault_proxy(store.port)
    options = store.options_via(proxy.url, cache_dir=str(tmp_path / "cache"), prefetch=2)
    dataset = wdsx.WebDataset(urls, options=options, manifest=False).to_tuple("__key__", "txt")
    got = sorted(tuple(item) for item in wdsx.WebLoader(dataset, batch_size=None, num_workers=2))
    assert got == sorted((sample["__key__"], sample["txt"]) for sample in local_samples(local.urls))
    assert len(os.listdir(tmp_path / "cache")) >= len(urls)
    fetched = len(proxy.gets())
    assert fetched == len(urls)
    assert samples(urls, options) == local_samples(local.urls)
    assert len(proxy.gets()) == fetched, "the second pass reads the local copies only"


def test_sink_object_appears_only_on_commit(writable_store):
    data = random_bytes(33 * MiB + 3, seed=4)
    sink = open_sink(writable_store.prefix + "out/shard.tar", writable_store.options)
    for start in range(0, len(data), 5 * MiB - 1):
        sink.write(data[start : start + 5 * MiB - 1])
    assert writable_store.get("out/shard.tar") is None, "two parts uploaded, nothing visible yet"
    sink.commit()
    assert writable_store.get("out/shard.tar") == data


def test_aborted_sink_leaves_no_object(writable_store):
    with pytest.raises(RuntimeError):
        with open_sink(writable_store.prefix + "out/aborted.tar", writable_store.options) as sink:
            sink.write(random_bytes(17 * MiB, seed=3))
            raise RuntimeError("the writer failed half way")
    assert writable_store.get("out/aborted.tar") is None


def test_killed_writer_leaves_no_object(writable_store, fault_proxy):
    proxy = fault_proxy(writable_store.port)
    options = writable_store.options_via(proxy.url)
    settings = json.dumps({"gcs": options.gcs, "azure": options.azure})
    url = writable_store.prefix + "out/killed.tar"
    command = [sys.executable, "-c", WRITER, url, settings, "20"]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT) as process:
        try:
            assert process.stdout is not None and process.stdout.readline() == b"written\n"
            assert any(request.method in ("POST", "PUT") for request in proxy.requests), "a part went up"
        finally:
            process.kill()
            process.wait()
    assert writable_store.get("out/killed.tar") is None


def test_shard_writer_output_reads_back(writable_store):
    pattern = writable_store.prefix + "written/shard-%06d.tar"
    with wdsx.ShardWriter(pattern, maxcount=10, options=writable_store.options, verbose=0) as writer:
        for index in range(25):
            writer.write({"__key__": f"{index:04d}", "txt": f"sample {index}"})
    urls = list_shards(writable_store.prefix + "written/", writable_store.options)
    assert urls == [pattern % n for n in range(3)]
    got = [
        (s["__key__"], s["txt"])
        for s in wdsx.WebDataset(urls, options=writable_store.options, manifest=False)
    ]
    assert got == [(f"{index:04d}", f"sample {index}".encode()) for index in range(25)]


def test_convert_writes_the_same_shards_as_locally(writable_store, tmp_path):
    src = _make_folder(tmp_path / "src", per_class=4)
    settings = ConvertSettings(maxcount=5)
    convert(str(src), str(tmp_path / "local" / "t"), settings)
    convert(str(src), writable_store.prefix + "data/t", settings, options=writable_store.options)
    for path in _shards(tmp_path / "local"):
        assert writable_store.get(f"data/{path.name}") == path.read_bytes()
    # a re-run into fewer shards cannot delete from a store: it names the earlier plan's others
    report = convert(
        str(src),
        writable_store.prefix + "data/t",
        ConvertSettings(maxcount=100),
        options=writable_store.options,
    )
    earlier = [path.name for path in _shards(tmp_path / "local")][1:]
    assert earlier and report.left == [writable_store.prefix + f"data/{name}" for name in earlier]
    assert report.removed == []
