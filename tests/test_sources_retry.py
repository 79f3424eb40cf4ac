"""Dropped, reset and stalled connections mid-shard, for every remote store (S3, HTTP, GCS, Azure,
the Hub), through a fault-injecting proxy.

The oracle is the shard's own bytes; the proxy counts what it forwarded and records each GET's
``Range`` header, so the tests see that a retry continues at the last byte delivered.
"""

from __future__ import annotations

import datetime
import email.utils
import re

import pytest

from tests.fixtures.remotes import MiB
from tests.fixtures.servers import FaultProxy, random_bytes, read_all
from wdsx.errors import SourceError
from wdsx.sources import open_source

pytestmark = pytest.mark.slow  # real storage servers behind a connection-cutting proxy

CUT_RANGE = (256 << 10, 1536 << 10)
"""Server-to-client bytes after which the proxy cuts a connection: a few cuts per 4 MiB shard."""


def fast_retries(**changes) -> dict:
    """Small reads (so little is in flight when a cut happens) and short backoff."""
    return dict(dict(chunk=64 << 10, backoff=0.001, retries=5), **changes)


def resumed_positions(proxy: FaultProxy) -> list[int]:
    """The start offset of every GET the proxy saw, in order (0 for a GET without Range)."""
    starts = []
    for request in proxy.gets():
        match = re.fullmatch(r"bytes=(\d+)-", request.range or "bytes=0-")
        assert match, request.range
        starts.append(int(match.group(1)))
    return starts


@pytest.mark.parametrize("fault", ["close", "reset"])
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("offset", [0, 1_234_567])
def test_cut_connections_resume_at_the_last_byte(remote, fault_proxy, seed, fault, offset):
    proxy = fault_proxy(remote.port, seed=seed, cut_after=CUT_RANGE, fault=fault)
    url, options = remote.via(proxy, **fast_retries())
    with open_source(url, offset, options) as source:
        assert read_all(source, 100_000) == remote.data[offset:]
    wanted = len(remote.data) - offset
    assert proxy.cuts >= 1
    if fault == "close":
        # After an RST the client's kernel drops what it had received but not yet handed to
        # the reader, so only a clean close makes the fetched total a measure of the client.
        assert proxy.bytes_down < 1.1 * wanted, f"fetched {proxy.bytes_down} bytes for {wanted}"
    starts = resumed_positions(proxy)
    assert starts[0] == offset and len(starts) == proxy.cuts + 1
    assert starts == sorted(set(starts)), "every retry starts further on, never from the start"


@pytest.mark.parametrize("offset, end", [(0, 1000), (4_096, 4_097), (1_234_567, 3_000_000)])
def test_a_bounded_read_asks_for_exactly_its_bytes(remote, fault_proxy, offset, end):
    proxy = fault_proxy(remote.port)
    url, options = remote.via(proxy, **fast_retries())
    with open_source(url, offset, options, end=end) as source:
        assert read_all(source) == remote.data[offset:end]
    assert [request.range for request in proxy.gets()] == [f"bytes={offset}-{end - 1}"]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_bounded_read_resumes_within_its_bounds(remote, fault_proxy, seed):
    offset, end = 1_000, 3_500_000
    proxy = fault_proxy(remote.port, seed=seed, cut_after=CUT_RANGE)
    url, options = remote.via(proxy, **fast_retries())
    with open_source(url, offset, options, end=end) as source:
        assert read_all(source, 100_000) == remote.data[offset:end]
    assert proxy.cuts >= 1
    ranges = [re.fullmatch(r"bytes=(\d+)-(\d+)", request.range or "") for request in proxy.gets()]
    assert all(ranges) and {int(match.group(2)) for match in ranges} == {end - 1}
    starts = [int(match.group(1)) for match in ranges]
    assert starts[0] == offset and starts == sorted(set(starts))


def test_stalled_connection_times_out_and_resumes(remote, fault_proxy):
    proxy = fault_proxy(remote.port, cut_after=(3 * MiB, 3 * MiB), fault="stall")
    url, options = remote.via(proxy, **fast_retries(timeout=0.5))
    with open_source(url, 0, options) as source:
        assert read_all(source) == remote.data
    starts = resumed_positions(proxy)
    assert len(starts) == 2 and 0 < starts[1] <= 3 * MiB


def test_gives_up_after_the_configured_retries(remote, fault_proxy):
    proxy = fault_proxy(remote.port, cut_after=(0, 0))
    url, options = remote.via(proxy, **fast_retries(retries=2))
    with pytest.raises(SourceError, match="gave up after 2 retries") as caught:
        open_source(url, 0, options)
    assert caught.value.url == url
    assert len(proxy.gets()) == 3


def test_object_replaced_during_a_read_is_an_error(remote, fault_proxy):
    proxy = fault_proxy(remote.port, cut_after=(2 * MiB, 2 * MiB))
    url, options = remote.via(proxy, **fast_retries())
    try:
        with open_source(url, 0, options) as source:
            assert source.read(MiB) == remote.data[: 64 << 10]
            remote.replace(random_bytes(len(remote.data), seed=99))
            with pytest.raises(SourceError, match="changed while reading") as caught:
                read_all(source)
        assert caught.value.url == url
    finally:
        remote.replace(remote.data)


@pytest.mark.parametrize(
    ("said", "seconds"),
    [
        ("7", 7.0),
        ("soon", None),
        ("", None),
        (None, None),
        ("in the past", 0.0),
        ("ahead", 3600.0),
        ("Mon, 1 Jan 99999999999 00:00:00 GMT", None),  # no datetime holds that year
    ],
)
def test_a_retry_waits_as_long_as_the_server_asks(monkeypatch, said, seconds):
    """``Retry-After`` (seconds or an HTTP date) sets the least wait before the next attempt,
    up to one timeout; the wait is read from what the retry sleeps, not timed."""
    from email.message import Message

    from wdsx.sources import SourceOptions
    from wdsx.sources import retry as retries
    from wdsx.sources.http import retry_after

    headers = Message()
    now = datetime.datetime.now(datetime.timezone.utc)
    if said == "in the past":
        said = email.utils.format_datetime(now - datetime.timedelta(hours=1))
    elif said == "ahead":
        said = email.utils.format_datetime(now + datetime.timedelta(hours=1))
    if said is not None:
        headers["Retry-After"] = said
    asked = retry_after(headers)
    if seconds is None:
        assert asked is None
    else:
        assert asked is not None and abs(asked - seconds) < 5
    slept: list[float] = []
    monkeypatch.setattr(retries.time, "sleep", slept.append)
    options = SourceOptions(backoff=0.01, timeout=60.0)
    retries.Attempts("http://x/a.tar", options).failed(retries.TransientError("503", asked), "GET")
    assert slept[0] >= min(asked or 0.0, options.timeout) and slept[0] <= max(0.02, min(asked or 0.0, 60.0))
