"""webdataset's ``cache`` module in wdsx: cache names, file-type checks, ``LRUCleanup``,
``StreamingOpen``, ``FileCache`` and 0.2's cached tar reading, compared with webdataset's."""

from __future__ import annotations

import gzip
import os
import shutil

import pytest
import webdataset
import webdataset.cache as web_cache

import wdsx
from wdsx import cache

URLS = [
    "http://example.com/path/to/shard-000001.tar",
    "https://host/a/b/c.tgz",
    "s3://bucket/deep/prefix/x.tar",
    "gs://bucket/y.tar",
    "/local/abs/z.tar",
    "relative/name.tar",
    "file:///tmp/f.tar",
    "pipe:curl -s -L https://host/a/shard-{0..3}.tar",
    "hf://datasets/org/repo/w.tar",
    "az://container/" + "long/" * 40 + "v.tar",
]


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("ndir", [0, 1, 2])
def test_url_to_cache_name_matches(url, ndir):
    assert cache.url_to_cache_name(url, ndir) == web_cache.url_to_cache_name(url, ndir)
    assert cache.islocal(url) == web_cache.islocal(url)


@pytest.fixture
def kinds(tmp_path, shards):
    text = tmp_path / "notes.txt"
    text.write_text("not a tar\n" * 100)
    zipped = tmp_path / "shard.tar.gz"
    with open(shards.urls[0], "rb") as source, gzip.open(zipped, "wb") as target:
        shutil.copyfileobj(source, target)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    return [shards.urls[0], str(zipped), str(text), str(empty)]


def test_file_type_checks_match(kinds):
    for path in kinds:
        assert cache.magic_filetype(path) == web_cache.magic_filetype(path)
        assert cache.check_tar_format(path) == web_cache.check_tar_format(path)
    if shutil.which("file"):
        assert [cache.get_filetype(p) for p in kinds] == [web_cache.get_filetype(p) for p in kinds]


def cache_dir_with_files(directory, sizes):
    os.makedirs(directory)
    for age, size in enumerate(sizes):
        path = os.path.join(directory, f"f{age}")
        with open(path, "wb") as stream:
            stream.write(b"x" * size)
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    return directory


@pytest.mark.parametrize("limit", [0, 100, 350, 10_000])
def test_lru_cleanup_keeps_the_same_files(tmp_path, limit):
    sizes = [100, 50, 200, 80, 120]
    remaining = []
    for side, module in (("ours", cache), ("theirs", web_cache)):
        directory = cache_dir_with_files(str(tmp_path / side), sizes)
        module.LRUCleanup(directory, limit, keyfn=os.path.getmtime, interval=None).cleanup()
        remaining.append(sorted(os.listdir(directory)))
    assert remaining[0] == remaining[1]
    directory = cache_dir_with_files(str(tmp_path / "function"), sizes)
    cache.lru_cleanup(directory, limit, keyfn=os.path.getmtime)
    assert sorted(os.listdir(directory)) == remaining[0]


def test_lru_cleanup_runs_at_most_once_per_interval(tmp_path):
    directory = cache_dir_with_files(str(tmp_path / "d"), [100, 100])
    cleaner = cache.LRUCleanup(directory, 10_000, interval=3600)
    cleaner.cleanup()
    cleaner.cache_size = 0
    cleaner.cleanup()
    assert len(os.listdir(directory)) == 2


def test_download_matches(tmp_path, shards):
    url = f"pipe:cat {shards.urls[1]}"
    cache.download(url, str(tmp_path / "ours"))
    web_cache.download(url, str(tmp_path / "theirs"))
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["ours", "shards", "theirs"]  # no temporary file left


def opened(stage, urls):
    return [(item["url"], item.get("local_path") is not None, item["stream"].read()) for item in stage(urls)]


def test_streaming_open_matches(shards):
    urls = [shards.urls[0], f"pipe:cat {shards.urls[1]}", {"url": shards.urls[2]}]
    assert opened(cache.StreamingOpen(), urls) == opened(web_cache.StreamingOpen(), urls)


def pipe_urls(shards):
    return [f"pipe:cat {url}" for url in shards.urls[:3]]


def test_file_cache_matches(tmp_path, shards):
    urls = [*pipe_urls(shards), shards.urls[3]]
    ours = opened(cache.FileCache(str(tmp_path / "ours")), urls)
    theirs = opened(web_cache.FileCache(str(tmp_path / "theirs")), urls)
    assert ours == theirs
    assert sorted(os.listdir(tmp_path / "ours")) == sorted(os.listdir(tmp_path / "theirs"))
    again = opened(cache.FileCache(str(tmp_path / "ours")), urls)
    assert again == ours


def test_file_cache_in_a_pipeline_gives_webdataset_samples(tmp_path, shards):
    def run(module, directory):
        dataset = module.DataPipeline(
            module.SimpleShardList(pipe_urls(shards)),
            module.cache.FileCache(directory),
            module.tariterators.tar_file_expander,
            module.tariterators.group_by_keys,
            module.to_tuple("__key__", "txt"),
        )
        return list(dataset)

    assert run(wdsx, str(tmp_path / "ours")) == run(webdataset, str(tmp_path / "theirs"))


def test_file_cache_rejects_what_is_not_a_tar(tmp_path, kinds):
    url = f"pipe:cat {kinds[2]}"
    for module in (cache, web_cache):
        with pytest.raises(ValueError, match="is not a tar archive"):
            list(module.FileCache(str(tmp_path / module.__name__))([url]))
    assert os.listdir(tmp_path / "wdsx.cache") == []


def test_file_cache_handler_skips_failures(tmp_path, shards):
    urls = ["pipe:exit 3", *pipe_urls(shards)[:1]]
    stage = cache.FileCache(str(tmp_path / "c"), handler=wdsx.ignore_and_continue)
    assert [item["url"] for item in stage(urls)] == urls[1:]


def test_cache_settings_read_and_write_the_environment(monkeypatch):
    monkeypatch.setenv("WDS_CACHE", "/somewhere")
    monkeypatch.delenv("WDS_CACHE_SIZE", raising=False)
    assert cache.default_cache_dir == "/somewhere"
    assert cache.default_cache_size == web_cache.default_cache_size == 1e18
    cache.default_cache_dir = "/elsewhere"
    assert os.environ["WDS_CACHE"] == "/elsewhere"
    assert cache.FileCache().cache_dir == "/elsewhere"


def test_cached_tarfile_samples_give_webdataset_samples(tmp_path, shards):
    """webdataset 0.2's cached reading, against webdataset 1.0's plain reading of the shards."""
    urls = [{"url": url} for url in pipe_urls(shards)]
    theirs = [
        (sample["__key__"], sample["txt"])
        for sample in webdataset.tariterators.tarfile_samples([{"url": item["url"]} for item in urls])
    ]
    ours = [
        (sample["__key__"], sample["txt"])
        for sample in cache.cached_tarfile_samples(
            [dict(item) for item in urls], cache_dir=str(tmp_path / "c"), url_to_name=wdsx.cache.pipe_cleaner
        )
    ]
    assert ours == theirs
    stage = wdsx.maybe_cached_tarfile_to_samples(cache_dir=str(tmp_path / "c"))
    staged = wdsx.DataPipeline(
        wdsx.SimpleShardList(pipe_urls(shards)), stage, wdsx.to_tuple("__key__", "txt")
    )
    assert list(staged) == theirs


def test_get_file_cached_layout(tmp_path, shards):
    spec = f"pipe:cat {shards.urls[0]}"
    dest = cache.get_file_cached(spec, cache_dir=str(tmp_path), url_to_name=lambda s: s[len("pipe:cat ") :])
    flattened = os.path.dirname(shards.urls[0]).lstrip("/").replace("/", "_")
    assert dest == os.path.join(str(tmp_path), flattened, os.path.basename(shards.urls[0]))
    with open(dest, "rb") as copy, open(shards.urls[0], "rb") as original:
        assert copy.read() == original.read()
