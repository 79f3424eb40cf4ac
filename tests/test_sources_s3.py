"""s3:// reads and writes against a real SeaweedFS server; boto3's own get_object is the oracle."""

from __future__ import annotations

import dataclasses

import botocore.exceptions
import pytest

from tests.fixtures.servers import random_bytes, read_all
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, open_sink, open_source
from wdsx.sources.s3 import S3Sink

pytestmark = pytest.mark.slow  # a real S3 server (SeaweedFS)

MiB = 1 << 20


@pytest.fixture(scope="module")
def shard(s3_server):
    """A 3 MiB + 77 byte object and its URL."""
    bucket = s3_server.new_bucket()
    data = random_bytes(3 * MiB + 77, seed=7)
    s3_server.client().put_object(Bucket=bucket, Key="train/shard-000.tar", Body=data)
    return f"s3://{bucket}/train/shard-000.tar", data


@pytest.mark.parametrize("offset", [0, 1, 512, 1_000_003, 3 * MiB + 76, 3 * MiB + 77])
def test_read_from_offset_equals_object_bytes(s3_server, fault_proxy, shard, offset):
    url, data = shard
    proxy = fault_proxy(s3_server.port)
    with open_source(url, offset, s3_server.options_via(proxy.url)) as source:
        assert source.local_path is None and source.seekable
        assert read_all(source) == data[offset:]
    first = proxy.gets("shard-000.tar")[0]
    assert first.range == (f"bytes={offset}-" if offset else None)


def test_endpoint_and_credentials_can_come_from_the_environment(s3_server, shard, monkeypatch):
    url, data = shard
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    with open_source(url, 10, SourceOptions()) as source:
        assert read_all(source) == data[10:]


def test_offset_past_the_end_is_an_error(s3_server, shard):
    url, data = shard
    with pytest.raises(SourceError, match=f"offset {len(data) + 1} is past the end") as caught:
        open_source(url, len(data) + 1, s3_server.options)
    assert caught.value.url == url


@pytest.mark.parametrize(
    "key, bucket_suffix, credentials, code",
    [
        ("missing.tar", "", {}, "NoSuchKey"),
        ("train/shard-000.tar", "-absent", {}, "NoSuchBucket"),
        ("train/shard-000.tar", "", {"aws_secret_access_key": "wrong"}, "SignatureDoesNotMatch"),
        ("train/shard-000.tar", "", {"config": {"signature_version": "unsigned"}}, "AccessDenied"),
    ],
)
def test_errors_name_the_url_and_what_s3_said(
    s3_server, fault_proxy, shard, key, bucket_suffix, credentials, code
):
    bucket = shard[0].split("/")[2]
    proxy = fault_proxy(s3_server.port)
    options = s3_server.options_via(proxy.url, backoff=5.0)
    options = dataclasses.replace(options, s3={**options.s3, **credentials})
    url = f"s3://{bucket}{bucket_suffix}/{key}"
    with pytest.raises(SourceError) as caught:
        open_source(url, 0, options)
    assert url in str(caught.value) and code in str(caught.value)
    assert len(proxy.gets()) == 1, "a permanent error must not be retried"


def test_sink_object_appears_only_on_commit(s3_server, s3_bucket):
    client = s3_server.client()
    url = f"s3://{s3_bucket}/out/small.tar"
    data = random_bytes(100_000, seed=1)
    sink = open_sink(url, s3_server.options)
    sink.write(data[:50_000])
    sink.write(data[50_000:])
    with pytest.raises(botocore.exceptions.ClientError):
        client.head_object(Bucket=s3_bucket, Key="out/small.tar")
    sink.commit()
    assert client.get_object(Bucket=s3_bucket, Key="out/small.tar")["Body"].read() == data


def test_multipart_sink_round_trips_content_larger_than_a_part(s3_server, s3_bucket):
    client = s3_server.client()
    data = random_bytes(12 * MiB + 3, seed=2)
    sink = S3Sink(f"s3://{s3_bucket}/out/large.tar", s3_server.options, part_size=5 * MiB)
    for start in range(0, len(data), 3 * MiB - 1):
        sink.write(data[start : start + 3 * MiB - 1])
    with pytest.raises(botocore.exceptions.ClientError):
        client.head_object(Bucket=s3_bucket, Key="out/large.tar")
    sink.commit()
    reply = client.get_object(Bucket=s3_bucket, Key="out/large.tar")
    assert reply["ETag"].strip('"').endswith("-3"), "three parts: 5 MiB, 5 MiB, the rest"
    assert reply["Body"].read() == data


def test_aborted_multipart_sink_leaves_no_object_and_no_upload(s3_server, s3_bucket):
    client = s3_server.client()
    with pytest.raises(RuntimeError):
        with S3Sink(f"s3://{s3_bucket}/out/aborted.tar", s3_server.options, part_size=5 * MiB) as sink:
            sink.write(random_bytes(11 * MiB, seed=3))
            raise RuntimeError("the writer failed half way")
    with pytest.raises(botocore.exceptions.ClientError):
        client.head_object(Bucket=s3_bucket, Key="out/aborted.tar")
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
