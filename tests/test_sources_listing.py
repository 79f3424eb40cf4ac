"""list_shards: S3 prefixes and globs against SeaweedFS, local globs against the file system."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from wdsx.sources import list_shards

pytestmark = pytest.mark.slow  # a real S3 server

KEYS = [
    "data/train-000.tar",
    "data/train-001.tar",
    "data/train-002.tar.gz",
    "data/train-010.tar",
    "data/valid-000.tgz",
    "data/notes.txt",
    "data/deep/train-100.tar",
    "other/train-000.tar",
]


@pytest.fixture(scope="module")
def bucket(s3_server):
    name = s3_server.new_bucket("listing")
    client = s3_server.client()
    for key in KEYS:
        client.put_object(Bucket=name, Key=key, Body=b"x")
    return name


def s3_urls(bucket, keys):
    return [f"s3://{bucket}/{key}" for key in keys]


def test_prefix_lists_every_shard_under_it(s3_server, bucket):
    expected = sorted(k for k in KEYS if k.startswith("data/") and not k.endswith(".txt"))
    assert list_shards(f"s3://{bucket}/data/", s3_server.options) == s3_urls(bucket, expected)


@pytest.mark.parametrize(
    "pattern, keys",
    [
        ("data/train-*.tar", ["data/train-000.tar", "data/train-001.tar", "data/train-010.tar"]),
        ("data/train-00?.tar*", ["data/train-000.tar", "data/train-001.tar", "data/train-002.tar.gz"]),
        ("data/train-0[01]0.tar", ["data/train-000.tar", "data/train-010.tar"]),
        ("*/train-000.tar", ["data/train-000.tar", "other/train-000.tar"]),
        ("data/*.tar", ["data/deep/train-100.tar", *[f"data/train-0{n}.tar" for n in ("00", "01", "10")]]),
    ],
)
def test_glob_matches_keys(s3_server, bucket, pattern, keys):
    assert list_shards(f"s3://{bucket}/{pattern}", s3_server.options) == s3_urls(bucket, sorted(keys))


def test_glob_lists_only_the_literal_prefix(s3_server, bucket, fault_proxy):
    proxy = fault_proxy(s3_server.port)
    list_shards(f"s3://{bucket}/data/train-0[01]*.tar", s3_server.options_via(proxy.url))
    (request,) = proxy.gets()
    assert "prefix=data%2Ftrain-0&" in request.target + "&"


def test_listing_follows_pages(s3_server, fault_proxy):
    bucket = s3_server.new_bucket("pages")
    client = s3_server.client()
    keys = [f"shards/{n:05d}.tar" for n in range(1003)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=b""), keys))
    proxy = fault_proxy(s3_server.port)
    assert list_shards(f"s3://{bucket}/shards/", s3_server.options_via(proxy.url)) == s3_urls(bucket, keys)
    assert len(proxy.gets()) == 2


def test_single_object_and_other_schemes_are_returned_unchanged(s3_server, bucket):
    assert list_shards(f"s3://{bucket}/data/train-000.tar", s3_server.options) == [
        f"s3://{bucket}/data/train-000.tar"
    ]
    assert list_shards("https://example.com/a-*.tar") == ["https://example.com/a-*.tar"]
    assert list_shards("pipe:cat a-*.tar") == ["pipe:cat a-*.tar"]


def test_local_glob_and_directory(tmp_path):
    for name in ["b-001.tar", "a-000.tar", "a-001.tar.gz", "notes.txt", "sub/c-000.tgz"]:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    root = str(tmp_path)
    assert list_shards(f"{root}/*-00?.tar*") == [
        f"{root}/a-000.tar",
        f"{root}/a-001.tar.gz",
        f"{root}/b-001.tar",
    ]
    assert list_shards(f"file:{root}/a-*") == [f"file:{root}/a-000.tar", f"file:{root}/a-001.tar.gz"]
    assert list_shards(f"{root}/") == [
        f"{root}/a-000.tar",
        f"{root}/a-001.tar.gz",
        f"{root}/b-001.tar",
        f"{root}/sub/c-000.tgz",
    ]
    assert list_shards(f"{root}/nothing-*.tar") == []
    assert list_shards(f"{root}/a-000.tar") == [f"{root}/a-000.tar"]
