"""hf:// specifics against a local Hub server: tokens from the standard places, the endpoint from
HF_ENDPOINT, revisions, the Hub's error codes, paginated listing, and redirects to a CDN that
must not receive the token.

What every store does (ranged reads, resume, cut connections, listing) is in
test_sources_stores.py and test_sources_retry.py.
"""

from __future__ import annotations

import pytest

from tests.fixtures.servers import RangeHTTPServer, random_bytes, read_all
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, list_shards, open_source
from wdsx.sources.hf import split_hf_url

pytestmark = pytest.mark.slow  # a local Hub server

DATA = random_bytes(300_001, seed=51)


@pytest.fixture(scope="module")
def repo(hub_server):
    repo = hub_server.new_repo()
    hub_server.add(repo, "data/a.tar", DATA)
    for revision in ("v1.0", "refs/pr/1"):
        hub_server.add(repo, "data/a.tar", revision.encode() * 3, revision=revision)
    return repo


@pytest.fixture
def clean_environment(monkeypatch, tmp_path):
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


def test_token_and_endpoint_from_the_environment(hub_server, repo, monkeypatch, clean_environment):
    monkeypatch.setenv("HF_ENDPOINT", hub_server.endpoint_url)
    monkeypatch.setenv("HF_TOKEN", hub_server.token)
    with open_source(f"{repo}/data/a.tar", 3, SourceOptions()) as source:
        assert read_all(source) == DATA[3:]


@pytest.mark.parametrize("where", ["HF_HOME", "HF_TOKEN_PATH"])
def test_token_from_the_hub_clients_token_file(
    hub_server, repo, monkeypatch, clean_environment, tmp_path, where
):
    path = tmp_path / "hf-home" / "token" if where == "HF_HOME" else tmp_path / "elsewhere"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(hub_server.token + "\n")
    if where == "HF_TOKEN_PATH":
        monkeypatch.setenv("HF_TOKEN_PATH", str(path))
    options = SourceOptions(hf={"endpoint": hub_server.endpoint_url})
    with open_source(f"{repo}/data/a.tar", 0, options) as source:
        assert read_all(source) == DATA


@pytest.mark.parametrize(
    "path, token, code",
    [
        ("data/a.tar", None, "RepoNotFound (HTTP 401)"),
        ("data/a.tar", "hf_wrong", "RepoNotFound (HTTP 401)"),
        ("data/missing.tar", "valid", "EntryNotFound (HTTP 404)"),
        ("@v2/data/a.tar", "valid", "RevisionNotFound (HTTP 404)"),
    ],
)
def test_errors_name_the_url_and_the_hubs_code(hub_server, fault_proxy, repo, path, token, code):
    proxy = fault_proxy(hub_server.port)
    url = f"{repo}{'' if path.startswith('@') else '/'}{path}"
    hf = {"endpoint": proxy.url, "token": hub_server.token if token == "valid" else token}
    with pytest.raises(SourceError) as caught:
        open_source(url, 0, SourceOptions(hf=hf, backoff=5.0))
    assert caught.value.url == url and url in str(caught.value) and code in str(caught.value)
    assert len(proxy.gets()) == 1, "a permanent error is not retried"


@pytest.mark.parametrize("revision", ["v1.0", "refs/pr/1", "refs%2Fpr%2F1"])
def test_revisions(hub_server, repo, revision):
    with open_source(
        f"{repo}@{revision}/data/a.tar", 0, hub_server.options_via(hub_server.endpoint_url)
    ) as source:
        assert read_all(source) == revision.replace("%2F", "/").encode() * 3


def test_listing_follows_pages(hub_server, fault_proxy):
    repo = hub_server.new_repo()
    urls = [hub_server.add(repo, f"train/{n:03d}.tar", b"x") for n in range(8)]
    hub_server.add(repo, "train/README.md", b"x")
    proxy = fault_proxy(hub_server.port)
    assert list_shards(f"{repo}/train/", hub_server.options_via(proxy.url)) == urls
    assert len(proxy.gets("/api/datasets/")) == 3, "nine entries and a directory, three per page"


def test_redirect_to_a_cdn_keeps_the_range_and_drops_the_token(hub_server, repo, fault_proxy):
    cdn = RangeHTTPServer(hub_server.root).start()
    try:
        cdn_proxy = fault_proxy(cdn.port)
        hub_server.redirect_files_to(cdn_proxy.url)
        with open_source(
            f"{repo}/data/a.tar", 1000, hub_server.options_via(hub_server.endpoint_url)
        ) as source:
            assert read_all(source) == DATA[1000:]
    finally:
        hub_server.redirect_files_to(None)
        cdn.stop()
    (request,) = cdn_proxy.gets()
    assert request.range == "bytes=1000-"
    assert "authorization" not in request.headers


@pytest.mark.parametrize(
    "url, kind, repo, revision, path",
    [
        ("hf://datasets/o/n/a/b.tar", "datasets", "o/n", "main", "a/b.tar"),
        ("hf://spaces/o/n@dev/b.tar", "spaces", "o/n", "dev", "b.tar"),
        ("hf://o/n@refs/pr/3/b.tar", "models", "o/n", "refs/pr/3", "b.tar"),
        (
            "hf://datasets/o/n@refs%2Fconvert%2Fparquet/x.tar",
            "datasets",
            "o/n",
            "refs/convert/parquet",
            "x.tar",
        ),
    ],
)
def test_url_forms(url, kind, repo, revision, path):
    where = split_hf_url(url)
    assert (where.kind, where.repo, where.revision, where.path) == (kind, repo, revision, path)
    assert where.base + where.path == url


def test_bad_urls_are_named():
    for url, said in [
        ("hf://only-a-name", "names a repository"),
        ("hf://datasets/o/n/", "needs a file"),
    ]:
        with pytest.raises(SourceError, match=said) as caught:
            open_source(url, 0, SourceOptions(hf={"endpoint": "http://127.0.0.1:9"}))
        assert caught.value.url == url
