"""http(s):// reads against a local Range-capable server; the served file's bytes are the oracle."""

from __future__ import annotations

import logging
import os
import re
import time

import pytest

from tests.fixtures.servers import RangeHTTPServer, _RangeHandler, random_bytes, read_all
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, open_source

DATA = random_bytes(2_000_003, seed=21)


@pytest.fixture(scope="module")
def name(http_server):
    http_server.add("http-shard.tar", DATA)
    return "http-shard.tar"


@pytest.mark.parametrize("offset", [0, 1, 4096, 1_999_999, 2_000_003])
def test_read_from_offset_sends_a_range_request(http_server, fault_proxy, name, offset):
    proxy = fault_proxy(http_server.port)
    with open_source(f"{proxy.url}/{name}", offset) as source:
        assert source.local_path is None and source.seekable
        assert read_all(source) == DATA[offset:]
    (request,) = proxy.gets(name)
    assert request.range == (f"bytes={offset}-" if offset else None)


@pytest.mark.parametrize("offset", [0, 777_777])
def test_server_ignoring_range_still_gives_the_right_bytes(http_server_ignoring_range, name, offset, caplog):
    caplog.set_level(logging.INFO, logger="wdsx")
    with open_source(http_server_ignoring_range.url(name), offset) as source:
        assert read_all(source) == DATA[offset:]
    ignored = [r for r in caplog.records if "ignored the range request" in r.getMessage()]
    assert len(ignored) == (1 if offset else 0)


def test_missing_file_names_url_and_status(http_server, fault_proxy):
    proxy = fault_proxy(http_server.port)
    url = f"{proxy.url}/no-such-shard.tar"
    with pytest.raises(SourceError, match="HTTP 404") as caught:
        open_source(url, 0, SourceOptions(backoff=5.0))
    assert caught.value.url == url and url in str(caught.value)
    assert len(proxy.gets()) == 1, "a 404 is not retried"


def test_offset_past_the_end_names_the_size(http_server, name):
    with pytest.raises(
        SourceError, match="offset 2000004 is past the end of the resource \\(2000003 bytes\\)"
    ):
        open_source(http_server.url(name), 2_000_004)


def test_unreachable_server_fails_after_retries(http_server):
    url = "http://127.0.0.1:9/shard.tar"
    with pytest.raises(SourceError, match="gave up after 1 retries") as caught:
        open_source(url, 0, SourceOptions(retries=1, backoff=0.001, timeout=2))
    assert "refused" in str(caught.value).lower()


CAP = 100_000


class _CappedRangeHandler(_RangeHandler):
    """Sends at most ``CAP`` bytes of each range asked for, as some servers and CDNs do."""

    def serve_file(self, path: str, body: bool) -> None:
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted:
            start = int(wanted.group(1))
            last = start + CAP - 1 if not wanted.group(2) else min(int(wanted.group(2)), start + CAP - 1)
            self.headers.replace_header("Range", f"bytes={start}-{last}")
        super().serve_file(path, body)


@pytest.fixture(scope="module")
def capped_server(http_server, name):
    server = RangeHTTPServer(http_server.root, handler=_CappedRangeHandler).start()
    yield server
    server.stop()


@pytest.mark.parametrize(("offset", "end"), [(1, None), (777_777, None), (5, 350_000)])
def test_a_server_that_sends_a_range_in_short_replies_gives_every_byte(capped_server, name, offset, end):
    options = SourceOptions(backoff=30.0)  # asking for the rest of a range must not wait
    with open_source(capped_server.url(name), offset, options, end=end) as source:
        assert read_all(source) == DATA[offset:end]


class _UnsizedCutHandler(_RangeHandler):
    """Answers a range with ``Content-Range: bytes A-B/*`` (the size left unsaid, as the
    standard allows) and, the first time, closes the connection after ``CAP`` bytes of it."""

    cut = 0

    def serve_file(self, path: str, body: bool) -> None:
        wanted = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        if not wanted:
            super().serve_file(path, body)
            return
        start, size = int(wanted.group(1)), os.stat(path).st_size
        headers = {"Content-Length": str(size - start), "Content-Range": f"bytes {start}-{size - 1}/*"}
        self._reply(206, headers, None)
        first = type(self).cut == 0
        type(self).cut += 1
        self._send_file(path, start, start + CAP if first else size)
        if first:
            self.close_connection = True


class _SlowHeadHandler(_RangeHandler):
    """The first time, sends the status line and then waits a second before the headers."""

    stalled = 0

    def serve_file(self, path: str, body: bool) -> None:
        if type(self).stalled == 0:
            type(self).stalled += 1
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            self.wfile.flush()
            time.sleep(1.0)  # the server misbehaving, not a timing assertion
            self.close_connection = True
            return
        super().serve_file(path, body)


@pytest.mark.parametrize(("handler", "offset"), [(_UnsizedCutHandler, 1), (_SlowHeadHandler, 0)])
def test_a_reply_cut_short_or_stalled_in_its_head_is_read_again(http_server, name, handler, offset):
    """A 206 that does not state the size still says how long it is: a connection closed
    before then is resumed, not taken for the end; a head that stalls past the timeout is
    asked for again, not taken for an empty reply."""
    server = RangeHTTPServer(http_server.root, handler=handler).start()
    try:
        options = SourceOptions(timeout=0.5, backoff=0.001)
        with open_source(server.url(name), offset, options) as source:
            assert read_all(source) == DATA[offset:]
    finally:
        server.stop()
