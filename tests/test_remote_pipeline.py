"""Whole pipelines over s3://, http:// and pipe: shards against the same shards read locally,
and resume on S3 by a ranged GET at the checkpointed offset (seen at a proxy)."""

from __future__ import annotations

import os
import time

import pytest

import wdsx
from tests.fixtures.shards import make_shards
from wdsx.read.samples import POSITION
from wdsx.state.position import unpack_positions

pytestmark = pytest.mark.slow  # a real S3 server and a connection-cutting proxy


def local_samples(urls: list[str]) -> list[dict]:
    return [strip(s) for s in wdsx.WebDataset(urls, manifest=False)]


def strip(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"}


@pytest.fixture(scope="module")
def dataset_in_s3(s3_server, tmp_path_factory):
    shards = make_shards(str(tmp_path_factory.mktemp("remote")), [30, 12, 25], payload=3000)
    bucket = s3_server.new_bucket("pipeline")
    client = s3_server.client()
    urls = []
    for path in shards.urls:
        key = f"train/{os.path.basename(path)}"
        with open(path, "rb") as stream:
            client.put_object(Bucket=bucket, Key=key, Body=stream.read())
        urls.append(f"s3://{bucket}/{key}")
    return shards, urls, bucket


def test_s3_pipeline_reads_what_local_reads(s3_server, dataset_in_s3):
    shards, urls, _ = dataset_in_s3
    remote = [strip(s) for s in wdsx.WebDataset(urls, options=s3_server.options, manifest=False)]
    assert remote == local_samples(shards.urls)


def test_s3_prefix_is_listed(s3_server, dataset_in_s3):
    shards, urls, bucket = dataset_in_s3
    dataset = wdsx.WebDataset(f"s3://{bucket}/train/", options=s3_server.options, manifest=False)
    assert dataset.urls == sorted(urls)


def test_resume_on_s3_is_a_ranged_get_at_the_recorded_offset(s3_server, fault_proxy, dataset_in_s3):
    shards, urls, _ = dataset_in_s3
    options = s3_server.options_via(fault_proxy(s3_server.port).url, prefetch=0)
    first = wdsx.WebDataset(urls, options=options, manifest=False)
    iterator = iter(first)
    for _ in range(17):
        next(iterator)
    state = first.state_dict()
    expected = next(iterator)
    progress = state["stages"]["reader"]
    assert progress["offset"] == expected[POSITION][1] > 0

    proxy = fault_proxy(s3_server.port)
    resumed = wdsx.WebDataset(urls, options=s3_server.options_via(proxy.url, prefetch=0), manifest=False)
    resumed.load_state_dict(state)
    assert strip(next(iter(resumed))) == strip(expected)
    requests = proxy.gets(os.path.basename(urls[0]))
    assert [r.range for r in requests] == [f"bytes={progress['offset']}-"]


def test_s3_through_webloader_with_prefetch_and_cache(s3_server, dataset_in_s3, tmp_path):
    shards, urls, _ = dataset_in_s3
    options = wdsx.SourceOptions(
        **{**vars(s3_server.options), "cache_dir": str(tmp_path / "cache"), "prefetch": 2}
    )
    dataset = wdsx.WebDataset(urls, options=options, manifest=False).to_tuple("__key__", "txt")
    loader = wdsx.WebLoader(dataset, batch_size=None, num_workers=2)
    got = sorted((key, text) for key, text in loader)
    expected = sorted((s["__key__"], s["txt"]) for s in local_samples(shards.urls))
    assert got == expected
    assert len([f for f in os.listdir(tmp_path / "cache") if f.endswith(".tar")]) == len(urls)


def test_http_pipeline_reads_what_local_reads(http_server, tmp_path):
    shards = make_shards(str(tmp_path), [9, 14])
    urls = []
    for path in shards.urls:
        with open(path, "rb") as stream:
            urls.append(http_server.add(os.path.basename(path), stream.read()))
    assert [strip(s) for s in wdsx.WebDataset(urls, manifest=False)] == local_samples(shards.urls)


def children() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stream:
                    fields = stream.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.add(int(entry))
    return found


def test_pipe_pipeline_and_no_process_left_after_an_early_stop(tmp_path):
    shards = make_shards(str(tmp_path), [20, 20])
    urls = [f"pipe:cat {path}" for path in shards.urls]
    assert [strip(s) for s in wdsx.WebDataset(urls, manifest=False)] == local_samples(shards.urls)
    before = children()
    iterator = iter(wdsx.WebDataset(urls, manifest=False))
    next(iterator)
    iterator.close()
    deadline = time.monotonic() + 10
    while children() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() - before == set()


def test_pipe_is_refused_in_secure_mode(tmp_path, monkeypatch):
    shards = make_shards(str(tmp_path), [2])
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(wdsx.SourceError, match="pipe"):
        list(wdsx.WebDataset([f"pipe:cat {shards.urls[0]}"], manifest=False))


@pytest.mark.parametrize("seed", [1, 2])
def test_s3_pipeline_survives_cut_connections(s3_server, fault_proxy, dataset_in_s3, seed):
    shards, urls, _ = dataset_in_s3
    proxy = fault_proxy(s3_server.port, seed=seed, cut_after=(20_000, 90_000))
    options = s3_server.options_via(proxy.url, retries=50, backoff=0.001)
    remote = [strip(s) for s in wdsx.WebDataset(urls, options=options, manifest=False)]
    assert remote == local_samples(shards.urls)
    assert proxy.cuts > 0


def test_restoring_a_shuffle_buffer_on_s3_reads_each_shard_about_once(s3_server, fault_proxy, dataset_in_s3):
    shards, urls, _ = dataset_in_s3

    def pipeline(proxy_url):
        options = s3_server.options_via(proxy_url, prefetch=0)
        return wdsx.WebDataset(urls, options=options, manifest=False).shuffle(40).to_tuple("__key__")

    full = [key for (key,) in pipeline(s3_server.endpoint_url)]
    first = pipeline(s3_server.endpoint_url)
    iterator = iter(first)
    before = [next(iterator)[0] for _ in range(35)]
    state = first.state_dict()
    assert len(unpack_positions(state["stages"]["shuffle"]["positions"])) >= 30
    proxy = fault_proxy(s3_server.port)
    resumed = pipeline(proxy.url)
    resumed.load_state_dict(state)
    assert before + [key for (key,) in resumed] == full
    assert len(proxy.gets()) <= 2 * len(urls)
