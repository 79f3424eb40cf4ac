"""Random access: ``IndexedDataset(urls)[i]`` is the ``i``-th sample of an unshuffled streaming
read (the oracle), for tar, JSONL and ``.npy`` shards, local, on S3 and over HTTP; reading one
sample costs one ranged request (counted at a proxy); it works with DataLoader,
DistributedSampler and StatefulDataLoader; ShardLocalSampler keeps reads in one shard."""

from __future__ import annotations

import os
import random
import re
import shutil

import numpy as np
import pytest
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

import wdsx
from tests.fixtures.records import make_jsonl_shards, make_npy_shards
from tests.fixtures.shards import make_shards, write_tar
from wdsx.commands import cli
from wdsx.pipeline.indexed import IndexedDataset, ShardLocalSampler
from wdsx.read.index import ShardIndex, index_url, load_index, scan_index

FORMATS = ("tar", "jsonl", "npy")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """One small corpus per format, each in its own folder, indexed by ``wdsx index``."""
    root = tmp_path_factory.mktemp("indexed")
    made = {
        "tar": make_shards(str(root / "tar"), [9, 1, 14], payload=700).urls,
        "jsonl": make_jsonl_shards(str(root / "jsonl"), [12, 3, 20]).urls,
        "npy": make_npy_shards(str(root / "npy"), [8, 1, 15], (2, 3)).urls,
    }
    for urls in made.values():
        assert cli.main(["index", *urls]) == 0
    return made


def streamed(urls, options=None) -> list[dict]:
    """The oracle: an unshuffled streaming read (without the run's epoch seed)."""
    samples = wdsx.WebDataset(urls, options=options, manifest=False)
    return [{k: v for k, v in s.items() if k != "__epoch_seed__"} for s in samples]


def assert_same(sample: dict, expected: dict) -> None:
    assert list(sample) == list(expected)
    for field, value in expected.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(sample[field], value) and sample[field].dtype == value.dtype
        else:
            assert sample[field] == value, field


@pytest.mark.parametrize("kind", FORMATS)
@pytest.mark.parametrize("with_index", [True, False])
def test_every_sample_equals_the_streaming_read(corpora, kind, with_index, tmp_path):
    urls = corpora[kind]
    if not with_index:  # a copy without .idx files or manifest: local shards are scanned
        urls = [str(shutil.copy(url, tmp_path / os.path.basename(url))) for url in urls]
    dataset = IndexedDataset(urls)
    expected = streamed(urls)
    assert len(dataset) == len(expected)
    for index in random.Random(0).sample(range(len(dataset)), len(dataset)):
        assert_same(dataset[index], expected[index])
    assert_same(dataset[-1], expected[-1])
    assert_same(dataset[np.int64(0)], expected[0])
    assert_same(dataset[torch.tensor(1)], expected[1])  # what DataLoader's samplers give
    with pytest.raises(IndexError, match=f"sample index {len(dataset)} out of range"):
        dataset[len(dataset)]
    with pytest.raises(IndexError, match=f"sample index {-len(dataset) - 1} out of range"):
        dataset[-len(dataset) - 1]
    for wrong in (1.5, "3", slice(0, 2)):
        with pytest.raises(TypeError, match="a sample index is an int"):
            dataset[wrong]


def test_the_index_is_small_and_follows_the_shard(corpora):
    for url in corpora["tar"] + corpora["jsonl"]:
        written = load_index(url)
        assert written is not None and np.array_equal(written.offsets, scan_index(url).offsets)
        assert os.path.getsize(index_url(url)) < 200 + 4 * written.samples
    offsets = np.array([0, 3, 700, 70_000, 7_000_000_000])
    assert np.array_equal(ShardIndex.from_json(ShardIndex("x", offsets).to_json()).offsets, offsets)


def test_compressed_and_unindexed_remote_shards_are_refused_with_a_reason(tmp_path, http_server):
    gz = write_tar(str(tmp_path / "a.tar.gz"), [("k.txt", b"x")])
    with pytest.raises(ValueError, match="random access needs uncompressed shards.*gunzip"):
        IndexedDataset(gz)
    url = http_server.add("unindexed-shard.tar", open(write_tar(str(tmp_path / "b.tar"), []), "rb").read())
    with pytest.raises(wdsx.ShardError, match=r"no offset index .*unindexed-shard\.tar\.idx.*wdsx index"):
        IndexedDataset(url, manifest=False)


def test_verify_notices_a_stale_index(corpora, tmp_path, capsys):
    url = str(shutil.copy(corpora["jsonl"][0], tmp_path / "part-0000.jsonl"))
    assert cli.main(["index", url]) == 0
    with open(url, "a") as stream:
        stream.write('{"late": true}\n')
    assert cli.main(["verify", url]) == 1
    assert "the shard was rewritten since" in capsys.readouterr().out  # the index knows its size


def test_a_rewritten_shard_never_meets_the_index_of_the_one_it_replaced(corpora, tmp_path):
    """A writer that replaces a shard removes the offset index beside it; an index whose shard
    changed size under it is refused. Random access then gives what streaming gives."""
    url = str(shutil.copy(corpora["jsonl"][0], tmp_path / "part-0000.jsonl"))
    assert cli.main(["index", url]) == 0
    with wdsx.JsonlWriter(url) as writer:  # the same number of lines, other lengths
        for i in range(len(list(wdsx.WebDataset(url, shardshuffle=False)))):
            writer.write({"i": i, "pad": "x" * (i % 5)})
    assert not os.path.exists(url + ".idx")
    streamed = [s["json"] for s in wdsx.WebDataset(url, shardshuffle=False)]
    indexed = wdsx.IndexedDataset(url)
    assert [indexed[i]["json"] for i in range(len(indexed))] == streamed
    assert cli.main(["index", url]) == 0
    with open(url, "a") as stream:
        stream.write('{"late": true}\n')
    with pytest.raises(wdsx.ShardError, match="the shard was rewritten since"):
        wdsx.IndexedDataset(url)[0]


def test_a_tar_shard_rewritten_at_its_size_by_another_tool_is_noticed(tmp_path):
    """tarfile pads to whole records, so a shard rewritten by another tool often keeps its
    size: the index's hash of the shard's ends tells the two apart."""
    import tarfile
    from io import BytesIO

    url = str(tmp_path / "a.tar")
    with wdsx.TarWriter(url) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "txt": "x", "cls": i})
    assert cli.main(["index", url]) == 0
    size = os.path.getsize(url)
    with tarfile.open(url, "w") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"n{i}.txt")
            info.size = 1
            tar.addfile(info, BytesIO(b"y"))
    assert os.path.getsize(url) == size
    with pytest.raises(wdsx.ShardError, match="the shard was rewritten since"):
        wdsx.IndexedDataset(url)[0]


def publish_http(server, urls, folder):
    """Copy shards, indexes and manifest into the server's root under ``folder``."""
    target = os.path.join(server.root, folder)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.dirname(urls[0]), target)
    return [server.url(f"{folder}/{os.path.basename(url)}") for url in urls]


def publish_s3(s3_server, urls):
    bucket = s3_server.new_bucket("indexed")
    client = s3_server.client()
    directory = os.path.dirname(urls[0])
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as stream:
            client.put_object(Bucket=bucket, Key=f"data/{name}", Body=stream.read())
    return [f"s3://{bucket}/data/{os.path.basename(url)}" for url in urls]


def shard_gets(proxy, names):
    return [r for r in proxy.gets() if r.target.split("?")[0].rsplit("/", 1)[-1] in names]


@pytest.mark.parametrize("kind", FORMATS)
def test_over_http_one_ranged_request_per_sample(corpora, kind, http_server, fault_proxy):
    urls = corpora[kind]
    published = publish_http(http_server, urls, f"indexed-{kind}")
    proxy = fault_proxy(http_server.port)
    remote = [url.replace(f":{http_server.port}/", f":{proxy.port}/") for url in published]
    dataset = IndexedDataset(remote)
    expected = streamed(remote)
    for shard in range(len(remote)):  # the first read of a shard may load its index or header
        dataset[int(dataset.starts[shard])]
    names = {os.path.basename(url) for url in urls}
    before = len(shard_gets(proxy, names))
    order = random.Random(1).sample(range(len(dataset)), len(dataset))
    for index in order:
        sample = dataset[index]
        assert_same(sample, expected[index])
    requests = shard_gets(proxy, names)[before:]
    assert len(requests) == len(order)
    # each request is bounded at both ends (a shard's first sample too): exactly one sample's bytes
    bounds = [re.fullmatch(r"bytes=(\d+)-(\d+)", r.range or "") for r in requests]
    assert all(bounds), [r.range for r in requests]
    if kind != "npy":  # from the sample's byte offset, ending before the next sample's
        starts = [expected[index]["__position__"].offset for index in order]
        assert [int(bound.group(1)) for bound in bounds] == starts
        for bound, index in zip(bounds, order):
            following = expected[index + 1] if index + 1 < len(expected) else None
            if following is not None and following["__url__"] == expected[index]["__url__"]:
                assert int(bound.group(2)) < following["__position__"].offset


@pytest.mark.slow
@pytest.mark.parametrize("kind", FORMATS)
def test_over_s3_one_ranged_request_per_sample(corpora, kind, s3_server, fault_proxy):
    urls = publish_s3(s3_server, corpora[kind])
    proxy = fault_proxy(s3_server.port)
    options = s3_server.options_via(proxy.url)
    dataset = IndexedDataset(urls, options=options)
    expected = streamed(urls, s3_server.options)
    for shard in range(len(urls)):
        dataset[int(dataset.starts[shard])]
    names = {os.path.basename(url) for url in urls}
    before = len(shard_gets(proxy, names))
    order = random.Random(2).sample(range(len(dataset)), len(dataset))
    for index in order:
        assert_same(dataset[index], expected[index])
    requests = shard_gets(proxy, names)[before:]
    assert len(requests) == len(order)
    assert all(re.fullmatch(r"bytes=\d+-\d+", r.range or "") for r in requests), [r.range for r in requests]


def keys(batch) -> list[str]:
    return [sample["__key__"] for sample in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_reads_every_sample(corpora, workers):
    dataset = IndexedDataset(corpora["jsonl"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=workers, collate_fn=keys)
    assert [key for batch in loader for key in batch] == [s["__key__"] for s in streamed(corpora["jsonl"])]


def test_distributed_samplers_split_the_samples(corpora):
    dataset = IndexedDataset(corpora["tar"])
    everything = [s["__key__"] for s in streamed(corpora["tar"])]
    seen = []
    for rank in range(2):
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=True)
        seen += [dataset[i]["__key__"] for i in sampler]
    assert sorted(set(seen)) == sorted(everything)
    shares = [list(ShardLocalSampler(dataset, num_replicas=3, rank=rank, seed=4)) for rank in range(3)]
    assert len({len(share) for share in shares}) == 1
    assert set().union(*map(set, shares)) == set(range(len(dataset)))


def test_a_stateful_dataloader_resumes_exactly(corpora):
    dataset = IndexedDataset(corpora["npy"])

    def loader():
        generator = torch.Generator().manual_seed(7)
        return StatefulDataLoader(dataset, batch_size=3, shuffle=True, generator=generator, collate_fn=keys)

    full = list(loader())
    first = loader()
    iterator = iter(first)
    before = [next(iterator) for _ in range(4)]
    state = first.state_dict()
    second = loader()
    second.load_state_dict(state)
    assert before + list(second) == full


def test_the_shard_local_sampler_stays_in_one_shard_at_a_time(corpora):
    dataset = IndexedDataset(corpora["tar"])
    sampler = ShardLocalSampler(dataset, seed=3)
    orders = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(len(dataset)))
        shards = [dataset.shard_of(i)[0] for i in order]
        assert sum(a != b for a, b in zip(shards, shards[1:])) == len(dataset.urls) - 1
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    assert list(ShardLocalSampler(dataset, shuffle=False)) == list(range(len(dataset)))


def test_the_sampler_reads_npy_rows_in_the_streaming_order(corpora, monkeypatch):
    """The streaming order of a shard shuffle without a seed (a seed asks for webdataset's
    order), whose pipeline seed is 0."""
    monkeypatch.delenv("WDS_SEED", raising=False)
    dataset = IndexedDataset(corpora["npy"])
    sampler = ShardLocalSampler(dataset, seed=0)
    streaming = wdsx.WebDataset(corpora["npy"], shardshuffle=True)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert [dataset[i]["__key__"] for i in sampler] == [s["__key__"] for s in streaming]
