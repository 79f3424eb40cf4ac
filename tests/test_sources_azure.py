"""az:// specifics against Azurite: errors, the credential chain, URL forms.

What every store does (ranged reads, resume, cut connections, listing, writing) is in
test_sources_stores.py and test_sources_retry.py.
"""

from __future__ import annotations

import dataclasses
import datetime

import pytest
from azure.storage.blob import ContainerSasPermissions, generate_container_sas

from tests.fixtures.servers import random_bytes, read_all
from tests.fixtures.stores import azure_store
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, list_shards, open_source

pytestmark = pytest.mark.slow  # Azurite


@pytest.fixture(scope="module")
def container(azure_server):
    store = azure_store(azure_server)
    data = random_bytes(300_001, seed=41)
    store.put("shards/a.tar", data)
    return store, data


@pytest.fixture
def no_azure_environment(monkeypatch):
    for name in ("CONNECTION_STRING", "ACCOUNT_NAME", "ACCOUNT", "ACCOUNT_KEY", "KEY", "SAS_TOKEN"):
        monkeypatch.delenv(f"AZURE_STORAGE_{name}", raising=False)


@pytest.mark.parametrize(
    "key, other_container, wrong_key, code",
    [
        ("shards/missing.tar", False, False, "BlobNotFound (HTTP 404)"),
        ("shards/a.tar", True, False, "ContainerNotFound (HTTP 404)"),
        ("shards/a.tar", False, True, "(HTTP 403)"),
    ],
)
def test_errors_name_the_url_and_what_azure_said(
    azure_server, fault_proxy, container, key, other_container, wrong_key, code
):
    store, _ = container
    proxy = fault_proxy(azure_server.port)
    options = azure_server.options_via(proxy.url, backoff=5.0)
    if wrong_key:
        options = dataclasses.replace(options, azure={**options.azure, "account_key": "d3Jvbmc=" * 11})
    url = ("az://no-such-container/" if other_container else store.prefix) + key
    with pytest.raises(SourceError) as caught:
        open_source(url, 0, options)
    assert caught.value.url == url and url in str(caught.value) and code in str(caught.value)
    assert len(proxy.gets()) == 1, "a permanent error is not retried"


def test_connection_string_from_the_environment(azure_server, container, monkeypatch, no_azure_environment):
    store, data = container
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_server.connection_string)
    with open_source(store.prefix + "shards/a.tar", 9, SourceOptions()) as source:
        assert read_all(source) == data[9:]
    assert list_shards(store.prefix + "shards/", SourceOptions()) == [store.prefix + "shards/a.tar"]


def test_account_and_key_from_the_environment(azure_server, container, monkeypatch, no_azure_environment):
    store, data = container
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", azure_server.account)
    monkeypatch.setenv("AZURE_STORAGE_KEY", azure_server.key)
    options = SourceOptions(azure={"account_url": f"{azure_server.endpoint_url}/{azure_server.account}"})
    with open_source(store.prefix + "shards/a.tar", 0, options) as source:
        assert read_all(source) == data


def test_sas_token(azure_server, container):
    store, data = container
    name = store.prefix[len("az://") : -1]
    sas = generate_container_sas(
        azure_server.account,
        name,
        account_key=azure_server.key,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    )
    options = SourceOptions(
        azure={"account_url": f"{azure_server.endpoint_url}/{azure_server.account}", "sas_token": sas}
    )
    with open_source(store.prefix + "shards/a.tar", 5, options) as source:
        assert read_all(source) == data[5:]
    assert list_shards(store.prefix + "shards/", options) == [store.prefix + "shards/a.tar"]


def test_abfs_urls_with_the_account_in_the_host(azure_server, container):
    store, data = container
    name = store.prefix[len("az://") : -1]
    url = f"abfs://{name}@{azure_server.account}.dfs.core.windows.net/shards/a.tar"
    with open_source(url, 0, azure_server.options) as source:
        assert read_all(source) == data
    assert list_shards(url.rsplit("/", 1)[0] + "/", azure_server.options) == [url]


def test_without_an_account_the_error_says_how_to_name_one(no_azure_environment):
    with pytest.raises(SourceError, match="AZURE_STORAGE_CONNECTION_STRING") as caught:
        open_source("az://container/shard.tar", 0, SourceOptions())
    assert caught.value.url == "az://container/shard.tar"
