"""gs:// specifics against fake-gcs-server: errors, the emulator from the environment, URL forms.

What every store does (ranged reads, resume, cut connections, listing, writing) is in
test_sources_stores.py and test_sources_retry.py.
"""

from __future__ import annotations

import pytest

from tests.fixtures.servers import random_bytes, read_all
from tests.fixtures.stores import gcs_store
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, list_shards, open_source
from wdsx.sources.gcs import GCSSink

pytestmark = pytest.mark.slow  # a GCS emulator


@pytest.fixture(scope="module")
def bucket(gcs_server):
    store = gcs_store(gcs_server)
    data = random_bytes(300_001, seed=31)
    store.put("shards/a.tar", data)
    return store, data


@pytest.mark.parametrize("key, other_bucket", [("shards/missing.tar", False), ("shards/a.tar", True)])
def test_errors_name_the_url_and_what_gcs_said(gcs_server, fault_proxy, bucket, key, other_bucket):
    store, _ = bucket
    proxy = fault_proxy(gcs_server.port)
    url = ("gs://no-such-bucket/" if other_bucket else store.prefix) + key
    with pytest.raises(SourceError) as caught:
        open_source(url, 0, gcs_server.options_via(proxy.url, backoff=5.0))
    assert caught.value.url == url and url in str(caught.value)
    assert "NotFound (HTTP 404)" in str(caught.value)
    assert len(proxy.gets()) == 1, "a permanent error is not retried"


def test_emulator_host_from_the_environment(gcs_server, bucket, monkeypatch):
    store, data = bucket
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint_url)
    with open_source(store.prefix + "shards/a.tar", 7, SourceOptions()) as source:
        assert read_all(source) == data[7:]
    assert list_shards(store.prefix + "shards/", SourceOptions()) == [store.prefix + "shards/a.tar"]


def test_gcs_scheme_is_an_alias(gcs_server, bucket):
    store, data = bucket
    url = "gcs://" + store.prefix[len("gs://") :] + "shards/a.tar"
    with open_source(url, 0, gcs_server.options) as source:
        assert read_all(source) == data
    assert list_shards(url.rsplit("/", 1)[0] + "/", gcs_server.options) == [url]


def test_bad_urls_are_named(gcs_server):
    for url, said in [("gs:///key.tar", "needs a bucket name"), ("gs://bucket/", "needs a key")]:
        with pytest.raises(SourceError, match=said) as caught:
            open_source(url, 0, gcs_server.options)
        assert caught.value.url == url
    with pytest.raises(ValueError, match="multiple of 262144"):
        GCSSink("gs://bucket/key.tar", gcs_server.options, part_size=100_000)


def test_parts_smaller_than_the_default_round_trip(gcs_server, bucket):
    store, _ = bucket
    data = random_bytes(3 * (256 << 10) + 5, seed=32)
    sink = GCSSink(store.prefix + "out/parts.tar", gcs_server.options, part_size=256 << 10)
    for start in range(0, len(data), 100_000):
        sink.write(data[start : start + 100_000])
    assert store.get("out/parts.tar") is None
    sink.commit()
    assert store.get("out/parts.tar") == data
