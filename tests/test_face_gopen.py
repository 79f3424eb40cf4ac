"""webdataset's ``gopen`` module in wdsx: the per-scheme openers, ``Pipe``, and the
``gopen_schemes`` table a program extends, compared with webdataset's."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import webdataset
from webdataset.gopen import Pipe as WebPipe
from webdataset.gopen import gopen_curl as web_gopen_curl
from webdataset.gopen import gopen_error as web_gopen_error
from webdataset.gopen import gopen_file as web_gopen_file
from webdataset.gopen import gopen_pipe as web_gopen_pipe
from webdataset.gopen import gopen_schemes as web_gopen_schemes
from webdataset.gopen import reader as web_reader
from webdataset.gopen import set_options as web_set_options

import wdsx
from wdsx.gopen import (
    Pipe,
    gopen_curl,
    gopen_error,
    gopen_file,
    gopen_pipe,
    gopen_schemes,
    reader,
    set_options,
)
from wdsx.sources import register, registered, scheme_of, unregister


def digest(stream) -> str:
    with stream:
        return hashlib.sha256(stream.read()).hexdigest()


def test_file_and_pipe_openers_match(shards):
    path = shards.urls[0]
    expected = digest(open(path, "rb"))
    for url in (path, "file://" + path):
        assert digest(gopen_file(url)) == digest(web_gopen_file(url)) == expected
    command = f"pipe:cat {path}"
    assert digest(gopen_pipe(command)) == digest(web_gopen_pipe(command)) == expected
    assert digest(reader(path)) == digest(web_reader(path)) == expected
    assert isinstance(gopen_pipe(command), Pipe)


def test_pipe_status_is_checked_as_in_webdataset():
    for pipe_class in (Pipe, WebPipe):
        failing = pipe_class("echo out; exit 3", mode="rb", shell=True)
        with pytest.raises(OSError, match="exit 3"):
            failing.read()
            failing.close()
        sigpipe = pipe_class("exit 141", mode="rb", shell=True, ignore_status=[141])
        assert sigpipe.read() == b""
        sigpipe.close()


def test_pipe_writes(tmp_path):
    for name, pipe_class in (("ours", Pipe), ("theirs", WebPipe)):
        target = tmp_path / name
        with pipe_class(f"cat > {target}", mode="wb", shell=True) as pipe:
            pipe.write(b"hello")
        assert target.read_bytes() == b"hello"


def test_set_options_matches():
    for pipe_class, set_opts in ((Pipe, set_options), (WebPipe, web_set_options)):
        pipe = pipe_class("true", mode="rb", shell=True)
        assert set_opts(pipe, timeout=3.0, ignore_errors=True, ignore_status=[7]) is True
        assert (pipe.timeout, pipe.ignore_errors, list(pipe.ignore_status)) == (3.0, True, [7])
        pipe.close()
        assert set_opts(object(), timeout=1.0) is False


def test_error_opener_matches():
    for opener in (gopen_error, web_gopen_error):
        with pytest.raises(ValueError, match="no gopen handler defined"):
            opener("nowhere://x", "rb", 8192)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_opener_reads_like_webdataset(shards):
    url = "file://" + shards.urls[1]
    assert digest(gopen_curl(url)) == digest(web_gopen_curl(url))


def test_scheme_table_lists_webdataset_entries(monkeypatch):
    monkeypatch.delenv("USE_AIS_FOR", raising=False)
    assert sorted(gopen_schemes) == sorted(web_gopen_schemes)
    assert gopen_schemes["__default__"] is gopen_error
    assert {name for name, opener in gopen_schemes.items() if opener is gopen_curl} == {
        name for name, opener in web_gopen_schemes.items() if opener is web_gopen_curl
    }


def local_opener(prefix: str):
    """An opener as a program writes one: strip its scheme, open the local file."""

    def opener(url, mode="rb", bufsize=8192, **kw):
        return open(url[len(prefix) :], mode)

    return opener


def keys_of(module, url: str) -> list[str]:
    dataset = module.WebDataset(url, shardshuffle=False).to_tuple("__key__", "txt")
    return [f"{key}:{bytes(text).decode()}" for key, text in dataset]


@pytest.mark.parametrize("prefix", ["mine://", "mine:"])
def test_a_scheme_a_program_adds_is_used(shards, prefix):
    """webdataset and wdsx, each with the same opener added, read the same samples; deleting
    the entry takes the scheme away again."""
    url = prefix + shards.urls[2]
    web_gopen_schemes["mine"] = local_opener(prefix)
    gopen_schemes["mine"] = local_opener(prefix)
    try:
        assert digest(wdsx.gopen(url)) == digest(webdataset.gopen(url))
        assert keys_of(wdsx, url) == keys_of(webdataset, url)
    finally:
        del web_gopen_schemes["mine"]
        del gopen_schemes["mine"]
    assert "mine" not in gopen_schemes
    with pytest.raises(Exception, match="mine"):
        digest(wdsx.gopen(url))


def test_replacing_a_built_in_scheme_and_restoring_it(http_server, shards):
    """A program's opener for ``http`` takes over from wdsx's reader; deleting the entry gives
    the scheme back to wdsx (and the table webdataset's entry)."""
    with open(shards.urls[3], "rb") as stream:
        url = http_server.add("face-gopen-shard.tar", stream.read())
    expected = digest(open(shards.urls[3], "rb"))
    seen = []

    def counting(url, mode="rb", bufsize=8192, **kw):
        seen.append(url)
        return open(shards.urls[3], "rb")

    before = registered("http")
    gopen_schemes["http"] = counting
    try:
        assert digest(wdsx.gopen(url)) == expected and seen == [url]
        assert len(list(wdsx.WebDataset(url, shardshuffle=False))) == shards.counts[3]
        assert len(seen) >= 2
    finally:
        del gopen_schemes["http"]
    assert gopen_schemes["http"] is gopen_curl
    assert registered("http") == before  # reader, writer, lister and bounded reads, all back
    count = len(seen)
    assert digest(wdsx.gopen(url)) == expected and len(seen) == count


def test_a_name_before_a_colon_is_a_scheme_only_when_registered(tmp_path, shards, monkeypatch):
    """``mine:/x`` names the scheme ``mine`` once a reader is registered under that name; until
    then, and for drive letters, ``pipe:`` and ``file:``, such names keep their meaning."""
    odd = ["C:/data/x.tar", "c:\\data\\x.tar", "mine:/x.tar", "train:v2.tar", "file:/x.tar"]
    assert [scheme_of(name) for name in odd] == ["file"] * len(odd)
    assert scheme_of("pipe:cat x.tar") == "pipe" and scheme_of("MINE://x.tar") == "mine"
    register("mine", lambda url, offset, options: None)  # type: ignore[arg-type, return-value]
    try:
        assert scheme_of("mine:/x.tar") == scheme_of("Mine:x.tar") == "mine"
        assert scheme_of("C:/data/x.tar") == "file" and scheme_of("train:v2.tar") == "file"
    finally:
        removed = unregister("mine")
    assert removed is not None and removed.sink is None and not removed.bounded
    assert registered("mine") is None and unregister("mine") is None
    assert scheme_of("mine:/x.tar") == "file"
    # A local shard whose name holds a colon is read as the file it is.
    monkeypatch.chdir(tmp_path)
    shutil.copyfile(shards.urls[0], "train:v2.tar")
    assert keys_of(wdsx, "train:v2.tar") == keys_of(webdataset, shards.urls[0])
