"""Sources against servers and inputs that misbehave: trickles, silences, endless replies and
companion files, malformed headers, credentials in URLs, presigned URLs, local directories.

Servers are the loopback ones of :mod:`tests.fixtures.hostile`. Stall windows are set short
(a fraction of a second) and each test asserts the error it ends in, never a duration; the
``timeout`` marks only bound a test that would hang. Memory is measured in a subprocess.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import zlib

import pytest

import wdsx
from tests.fixtures.hostile import (
    HostileHTTPServer,
    endless,
    raw_headers,
    redirect,
    serve,
    silence,
    trickle,
    trickled_head,
)
from tests.fixtures.peak import REPORT_PEAK, reported_peak
from tests.fixtures.servers import random_bytes, read_all
from tests.fixtures.shards import tar_bytes
from wdsx.errors import SourceError
from wdsx.read.index import ShardIndex, index_url, load_index
from wdsx.read.manifest import Manifest, ShardEntry, manifest_url_for_shard
from wdsx.sources import (
    SourceOptions,
    list_shards,
    lister_for,
    missing_local_shards,
    names_several,
    open_source,
)
from wdsx.sources.http import Target, fetch_json
from wdsx.sources.stall import STALL_TIMEOUT, stall_window

pytestmark = pytest.mark.slow  # misbehaving servers, waited on for their stall windows

WINDOW = 0.3
"""The stall window of these tests, in seconds."""
MEMBERS = [(f"s{i:03d}.{ext}", f"{ext} of {i}".encode()) for i in range(5) for ext in ("txt", "cls")]
SHARD = tar_bytes(MEMBERS)


PATIENT = SourceOptions(retries=1, backoff=0.0)
"""For the tests that are not about stalls: the default window, so a loaded machine never
makes a healthy read look stalled."""


def stalling(**changes: object) -> SourceOptions:
    """Options with a short stall window, one retry and no backoff."""
    settings: dict = dict(stall_timeout=WINDOW, retries=1, backoff=0.0)
    settings.update(changes)
    return SourceOptions(**settings)


def read_until_error(source: object, size: int = 64) -> tuple[bytes, BaseException]:
    """The bytes a source returned before it raised, and what it raised."""
    received = bytearray()
    try:
        while part := source.read(size):  # type: ignore[attr-defined]
            received += part
    except SourceError as exn:
        return bytes(received), exn
    raise AssertionError(f"the read ended without an error after {len(received)} bytes")


def oracle_keys(data: bytes) -> list[str]:
    """Sample keys of a tar, by Python's tarfile."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        return list(dict.fromkeys(name.split(".", 1)[0] for name in archive.getnames()))


# ----------------------------------------------------------------------------- stalls


@pytest.mark.timeout(30)
def test_a_trickling_server_is_retried_from_its_last_byte_then_fails(hostile_http):
    data = random_bytes(5000, seed=3)
    hostile_http.route("trickle.tar", trickle(data, interval=0.02))
    url = hostile_http.url("trickle.tar")
    with open_source(url, 0, stalling()) as source:
        received, error = read_until_error(source)
    assert received == data[: len(received)]
    first, second = hostile_http.seen("trickle.tar")
    assert first.range is None
    resumed_at = int(second.range.removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed_at <= len(received), "the retry starts at the last byte delivered"
    message = str(error)
    assert message.startswith(url) and "gave up after 1 retries" in message and "stalled" in message
    assert f"reading at byte {len(received)}" in message


@pytest.mark.timeout(30)
def test_a_dataset_over_a_trickling_server_ends_in_the_error(hostile_http):
    hostile_http.route("trickle.tar", trickle(SHARD, interval=0.02))
    url = hostile_http.url("trickle.tar")
    dataset = wdsx.WebDataset(url, shardshuffle=False, manifest=False, options=stalling())
    with pytest.raises(
        SourceError, match=r"trickle\.tar: reading at byte \d+: gave up after 1 retries: stalled"
    ):
        list(dataset)


@pytest.mark.timeout(30)
def test_a_silent_server_is_stalled_within_the_window(hostile_http):
    hostile_http.route("silent.tar", silence(1000))
    with pytest.raises(SourceError, match=r"reading at byte 0: gave up after 1 retries: stalled: 0 bytes"):
        open_source(hostile_http.url("silent.tar"), 0, stalling(timeout=60.0)).read(100)
    assert len(hostile_http.seen("silent.tar")) == 2


@pytest.mark.timeout(30)
def test_reply_headers_that_trickle_are_cut_off_at_the_read_timeout(hostile_http):
    """Each header byte comes within the socket timeout, so only a deadline on the whole head
    ends the wait (a fuzz finding: the reader waited for as long as the server trickled)."""
    hostile_http.route("slow-head.tar", trickled_head(SHARD, interval=0.05))
    with pytest.raises(
        SourceError, match=r"gave up after 1 retries: .*status line and headers took more than 0.3 s"
    ):
        open_source(hostile_http.url("slow-head.tar"), 0, stalling()).read(100)
    assert len(hostile_http.seen("slow-head.tar")) == 2


def chunked(data: bytes, sizes: list[int]) -> bytes:
    """``data`` in chunked framing, the chunk size lines saying ``sizes`` (the data is cut in
    512-byte chunks whatever they say)."""
    pieces = [data[at : at + 512] for at in range(0, len(data), 512)]
    body = b"".join(b"%x\r\n" % size + piece + b"\r\n" for size, piece in zip(sizes, pieces))
    return body + b"0\r\n\r\n"


@pytest.mark.timeout(30)
def test_a_damaged_chunk_size_is_an_error_not_other_bytes(hostile_http):
    """A chunk size one too large: http.client alone reads the chunk's CRLF as data and goes
    on, delivering other bytes than the shard's (a fuzz finding); the framing is checked."""
    sizes = [512] * (len(SHARD) // 512)
    hostile_http.route("chunked.tar", raw_headers({"Transfer-Encoding": "chunked"}, chunked(SHARD, sizes)))
    assert (
        read_all(open_source(hostile_http.url("chunked.tar"), 0, PATIENT)) == SHARD
    )  # the framing read right
    sizes[3] += 1
    hostile_http.route("damaged.tar", raw_headers({"Transfer-Encoding": "chunked"}, chunked(SHARD, sizes)))
    with pytest.raises(SourceError, match=r"damaged\.tar: .*not CRLF: damaged chunked framing"):
        read_all(open_source(hostile_http.url("damaged.tar"), 0, PATIENT))


def test_a_416_to_the_size_request_too_is_a_source_error(hostile_http):
    """A server that answers 416 to the GET and to the HEAD asking for the size: a SourceError
    (a fuzz finding: urllib's HTTPError escaped)."""
    hostile_http.route("always-416.tar", raw_headers({"Content-Length": "0"}, status=416))
    with pytest.raises(SourceError, match=r"always-416\.tar: .*HTTP 416"):
        open_source(hostile_http.url("always-416.tar"), 0, PATIENT).read(100)


@pytest.mark.timeout(30)
def test_a_consumer_slower_than_the_window_is_not_a_stall(hostile_http):
    data = random_bytes(200_000, seed=4)
    hostile_http.route("fine.tar", serve(data))
    received = bytearray()
    with open_source(hostile_http.url("fine.tar"), 0, stalling(stall_timeout=0.5, chunk=1 << 20)) as source:
        while part := source.read(100_000):
            received += part
            time.sleep(0.6)  # longer than the window: the caller's time between reads is not waiting
    assert bytes(received) == data
    assert len(hostile_http.seen("fine.tar")) == 1


@pytest.mark.timeout(30)
def test_the_stall_window_comes_from_the_environment(hostile_http, monkeypatch):
    hostile_http.route("silent.tar", silence(10))
    monkeypatch.setenv(STALL_TIMEOUT, str(WINDOW))
    with pytest.raises(SourceError, match=rf"over {WINDOW}s"):
        open_source(hostile_http.url("silent.tar"), 0, SourceOptions(retries=0)).read(10)
    monkeypatch.setenv(STALL_TIMEOUT, "soon")
    with pytest.raises(ValueError, match=f"{STALL_TIMEOUT} must be a number of seconds, not 'soon'"):
        stall_window(SourceOptions())
    with pytest.raises(ValueError, match="positive"):
        stall_window(SourceOptions(stall_timeout=0))


@pytest.mark.slow  # real storage servers
@pytest.mark.timeout(120)
def test_every_store_retries_a_trickle_then_fails(remote, trickle_proxy):
    proxy = trickle_proxy(remote.port, head=4096, interval=0.05)
    # 4 KiB at once (the reply's headers and the store's own small API replies), then a
    # trickle far below the minimum rate, on every connection.
    url, options = remote.via(proxy, **dict(stall_timeout=WINDOW, min_rate=1 << 20, retries=1, backoff=0.0))
    with open_source(url, 0, options) as source:
        received, error = read_until_error(source, 1 << 16)
    assert received == remote.data[: len(received)]
    assert "gave up after 1 retries: stalled" in str(error)
    ranged = [request.range for request in proxy.gets() if request.range]
    assert ranged, "the stalled read was retried with a ranged request"
    resumed_at = int(ranged[-1].removeprefix("bytes=").partition("-")[0])
    assert 0 < resumed_at <= len(received), "the retry starts at the last byte delivered"


@pytest.mark.timeout(30)
def test_a_stalled_pipe_fails_naming_the_byte():
    with open_source("pipe:printf abc; exec sleep 30", 0, SourceOptions(stall_timeout=WINDOW)) as source:
        received, error = read_until_error(source)
    assert received == b"abc"
    assert "reading at byte 3: stalled" in str(error)


# ----------------------------------------------------------------------------- endless replies


@pytest.mark.timeout(30)
def test_content_length_bounds_a_reply_that_goes_on(hostile_http):
    hostile_http.route("long.tar", endless(SHARD, bytes(1 << 16), content_length=len(SHARD)))
    url = hostile_http.url("long.tar")
    with open_source(url, 0, PATIENT) as source:
        assert read_all(source) == SHARD
    samples = list(wdsx.WebDataset(url, shardshuffle=False, manifest=False))
    assert [sample["__key__"] for sample in samples] == oracle_keys(SHARD)


@pytest.mark.timeout(30)
def test_a_recorded_size_bounds_an_endless_reply(hostile_http):
    hostile_http.route("endless.tar", endless(SHARD, bytes(1 << 16)))
    url = hostile_http.url("endless.tar")
    with open_source(url, 0, PATIENT, size=len(SHARD)) as source:
        received, error = read_until_error(source, 1 << 16)
    assert received == SHARD
    assert str(error) == f"{url}: the stream goes on past byte {len(SHARD)}, the shard's recorded size"


def route_with_manifest(server: HostileHTTPServer, shards: dict[str, bytes], reply: object = endless) -> None:
    """Serve each of ``shards`` under ``d/`` followed by endless zero bytes, no Content-Length,
    beside a manifest that records each one's true size and sample count."""
    entries = []
    for name, data in shards.items():
        server.route(f"d/{name}", endless(data, bytes(1 << 16)))
        samples = len(oracle_keys(data)) if name.endswith(".tar") else data.count(b"\n")
        entries.append(ShardEntry(name, samples, len(data)))
    server.route("d/train.manifest.json", serve(Manifest(entries).to_json().encode()))


def past_the_size(url: str, size: int) -> str:
    return re.escape(f"{url}: the stream goes on past byte {size}, the shard's recorded size")


@pytest.mark.timeout(30)
def test_a_manifest_size_ends_a_tar_followed_by_endless_zeros(hostile_http, caplog):
    """The probe: a valid tar, then zero bytes without end and no Content-Length. With the
    manifest beside it, the dataset ends in an error at the recorded size; the samples before
    it are all delivered (a continuing handler sees them, then the error)."""
    other = tar_bytes([(f"t{i:03d}.txt", random_bytes(8000, seed=i)) for i in range(3)])
    route_with_manifest(hostile_http, {"train-000000.tar": SHARD, "train-000001.tar": other})
    urls = [hostile_http.url(f"d/train-00000{i}.tar") for i in range(2)]
    with pytest.raises(SourceError, match=past_the_size(urls[0], len(SHARD))):
        list(wdsx.WebDataset(urls, shardshuffle=False))
    # The second shard is opened ahead of time while the first is read, and its first 16 KiB
    # buffered (4 chunks): the rest of it streams from that prefetched source, bounded too.
    small_chunks = SourceOptions(chunk=4096)
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        dataset = wdsx.WebDataset(
            urls, shardshuffle=False, handler=wdsx.warn_and_continue, options=small_chunks
        )
        keys = [sample["__key__"] for sample in dataset]
    assert keys == oracle_keys(SHARD) + oracle_keys(other)
    warned = "\n".join(record.getMessage() for record in caplog.records)
    assert re.search(past_the_size(urls[0], len(SHARD)), warned)
    assert re.search(past_the_size(urls[1], len(other)), warned)


@pytest.mark.timeout(30)
def test_a_manifest_size_ends_a_jsonl_shard_that_goes_on(hostile_http):
    lines = b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(4))
    route_with_manifest(hostile_http, {"train-000000.jsonl": lines})
    url = hostile_http.url("d/train-000000.jsonl")
    with pytest.raises(SourceError, match=past_the_size(url, len(lines))):
        list(wdsx.WebDataset(url, shardshuffle=False))


@pytest.mark.timeout(30)
def test_the_manifest_of_a_presigned_url_with_slashes_in_its_query_is_used(hostile_http):
    """A query may hold ``/`` (a signature's credential scope does): the shard is still beside
    its manifest, so the recorded size bounds the reply."""
    route_with_manifest(hostile_http, {"train-000000.tar": SHARD})
    url = hostile_http.url("d/train-000000.tar?scope=20261126/us-east-1/s3")
    with pytest.raises(SourceError, match=past_the_size(url, len(SHARD))):
        list(wdsx.WebDataset(url, shardshuffle=False))


def run_measured(code: str, timeout: float = 60.0) -> tuple[int, str, float]:
    """Run ``code`` in a fresh Python; its exit status, its output and its peak RSS in MB
    (as the child itself measured it: see :mod:`tests.fixtures.peak`)."""
    output = subprocess.PIPE
    process = subprocess.Popen(
        [sys.executable, "-c", REPORT_PEAK + code], stdout=output, stderr=subprocess.STDOUT
    )
    killer = threading.Timer(timeout, process.kill)
    killer.start()
    try:
        assert process.stdout is not None
        text = process.stdout.read().decode(errors="replace")
        _, status, usage = os.wait4(process.pid, 0)
    finally:
        killer.cancel()
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, text, (reported_peak(text) or usage.ru_maxrss * 1024) / (1 << 20)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_endless_manifest_is_refused_in_bounded_memory(hostile_http):
    head = b'{"format": "wdsx-manifest", "version": 1, "shards": [\n'
    hostile_http.route(
        "d/train.manifest.json", endless(head, b'{"name": "x.tar", "samples": 1, "bytes": 1},\n' * 1000)
    )
    url = hostile_http.url("d/train.manifest.json")
    code = f"""
from wdsx.errors import SourceError
from wdsx.read.manifest import Manifest
try:
    Manifest.load({url!r})
except SourceError as exn:
    print("refused:", exn)
"""
    status, output, peak_mb = run_measured(code)
    assert status == 0, output
    assert f"refused: {url}: larger than {SourceOptions().max_companion_bytes} bytes" in output
    assert peak_mb < 500, f"peak RSS {peak_mb:.0f} MB"


@pytest.mark.timeout(30)
def test_an_endless_index_or_api_reply_is_refused(hostile_http):
    hostile_http.route("d/a.tar.idx", endless(b'{"format": "wdsx-offsets", ', b" " * 4096))
    options = SourceOptions(retries=1, backoff=0.0, max_companion_bytes=100_000)
    with pytest.raises(SourceError, match=r"a\.tar\.idx: larger than 100000 bytes"):
        load_index(hostile_http.url("d/a.tar"), options)
    url = hostile_http.url("d/a.tar.idx")
    with pytest.raises(SourceError, match=r"listing: the reply is larger than 100000 bytes"):
        fetch_json(url, Target(url), options, "listing")


def packed_index(samples: int, deltas: bytes, dtype: str = "|u1") -> str:
    """An offset index's JSON text claiming ``samples`` over these packed differences."""
    packed = base64.b64encode(zlib.compress(deltas)).decode()
    return json.dumps(
        {
            "format": "wdsx-offsets",
            "version": 1,
            "shard": "a.tar",
            "samples": samples,
            "dtype": dtype,
            "offsets": packed,
        }
    )


def test_an_index_inflates_only_the_offsets_it_claims():
    good = ShardIndex.from_json(packed_index(2, bytes([0, 5, 7])), "a.tar.idx")
    assert good.offsets.tolist() == [0, 5, 12]
    bomb = packed_index(2, bytes(64 << 20))  # 64 MiB of zeros in 64 KiB, for 3 offsets
    with pytest.raises(ValueError, match=r"a\.tar\.idx: its offsets are not the 3 numbers of 2 samples"):
        ShardIndex.from_json(bomb, "a.tar.idx")
    with pytest.raises(ValueError, match=r"claims 1000000000000 samples, more than"):
        ShardIndex.from_json(packed_index(10**12, bytes(8)), "a.tar.idx")
    with pytest.raises(ValueError, match=r"claims -5 samples"):
        ShardIndex.from_json(packed_index(-5, b""), "a.tar.idx")
    with pytest.raises(ValueError, match=r"offsets of type '\|O', not integers"):
        ShardIndex.from_json(packed_index(1, bytes(16), "|O"), "a.tar.idx")


# ----------------------------------------------------------------------------- headers


@pytest.mark.parametrize("value", ["abc", "-1", "1e3", "12, 12", "", "9" * 40])
def test_a_malformed_content_length_names_url_and_header(hostile_http, value):
    hostile_http.route("bad.tar", raw_headers({"Content-Length": value}, SHARD))
    url = hostile_http.url("bad.tar")
    with pytest.raises(SourceError) as caught:
        open_source(url, 0, PATIENT)
    assert str(caught.value).startswith(f"{url}: malformed Content-Length header {value[:80]!r}")
    assert len(hostile_http.seen("bad.tar")) == 1, "a malformed reply is not retried"


def test_a_malformed_content_range_names_url_and_header(hostile_http):
    hostile_http.route(
        "bad.tar", raw_headers({"Content-Range": "bytes 5-x/100", "Content-Length": "95"}, status=206)
    )
    with pytest.raises(SourceError, match=r"bad\.tar: malformed Content-Range header 'bytes 5-x/100'"):
        open_source(hostile_http.url("bad.tar"), 5, PATIENT)


# ----------------------------------------------------------------------------- credentials

USER, PASSWORD = "alice", "p@ss:w0rd/"
USERINFO = "alice:p%40ss%3Aw0rd%2F"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def needs_basic_auth(handler: object) -> int | None:
    return None if handler.headers.get("Authorization") == BASIC else 401  # type: ignore[attr-defined]


def test_userinfo_is_sent_as_basic_auth(hostile_http):
    hostile_http.route("c.tar", serve(SHARD, check=needs_basic_auth))
    url = hostile_http.url("c.tar", USERINFO)
    with open_source(url, 0, PATIENT) as source:
        assert read_all(source) == SHARD
        assert "p%40ss" not in repr(source) and "***@" in repr(source)
    (request,) = hostile_http.seen("c.tar")
    assert request.target == "/c.tar" and request.headers["Authorization"] == BASIC
    samples = list(wdsx.WebDataset(url, shardshuffle=False, manifest=False))
    assert [sample["__key__"] for sample in samples] == oracle_keys(SHARD)


def test_credentials_never_show_in_errors_or_logs(hostile_http, caplog):
    caplog.set_level(logging.DEBUG, logger="wdsx")
    hostile_http.route("busy.tar", raw_headers({"Content-Length": "0"}, status=503))
    for path in ("missing.tar", "busy.tar"):
        with pytest.raises(SourceError) as caught:
            open_source(hostile_http.url(path, USERINFO), 0, PATIENT)
        assert "***@" in str(caught.value) and "p%40ss" not in str(caught.value)
    assert "retry 1 of 1" in caplog.text
    assert "p%40ss" not in caplog.text and PASSWORD not in caplog.text


def test_credentials_do_not_follow_a_redirect_to_another_host(hostile_http):
    other = HostileHTTPServer().start()
    try:
        other.route("c.tar", serve(SHARD))
        hostile_http.route("c.tar", redirect(other.url("c.tar")))
        with open_source(hostile_http.url("c.tar", USERINFO), 0, PATIENT) as source:
            assert read_all(source) == SHARD
        assert hostile_http.seen("c.tar")[0].headers["Authorization"] == BASIC
        assert "Authorization" not in other.seen("c.tar")[0].headers
    finally:
        other.stop()


# ----------------------------------------------------------------------------- presigned URLs

SIGNED = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F20261126&X-Amz-Signature=c0ffee"


def test_companion_urls_leave_the_query_off():
    url = f"https://host/d/train-000003.tar?{SIGNED}#part"
    assert manifest_url_for_shard(url) == "https://host/d/train.manifest.json"
    assert index_url(url) == "https://host/d/train-000003.tar.idx"
    manifest = Manifest([ShardEntry("train-000003.tar", 7, 100)])
    assert manifest.counts_for([url]) == [7]
    assert manifest_url_for_shard("d/odd?name-000001.tar") == "d/odd?name.manifest.json"  # a local name


def test_a_presigned_shard_is_read_and_never_requested_with_another_query(hostile_http):
    def signed_only(handler: object) -> int | None:
        return None if handler.path.endswith("?" + SIGNED) else 403  # type: ignore[attr-defined]

    hostile_http.route("d/train-000000.tar", serve(SHARD, check=signed_only))
    manifest = Manifest([ShardEntry("train-000000.tar", len(oracle_keys(SHARD)), len(SHARD))])
    hostile_http.route("d/train.manifest.json", serve(manifest.to_json().encode()))
    url = hostile_http.url(f"d/train-000000.tar?{SIGNED}")
    dataset = wdsx.WebDataset(url, shardshuffle=False)
    assert [sample["__key__"] for sample in dataset] == oracle_keys(SHARD)
    assert dataset.manifest == manifest
    assert [r.target for r in hostile_http.seen("/d/train.manifest.json")] == ["/d/train.manifest.json"]
    shard_requests = hostile_http.seen("/d/train-000000.tar")
    assert shard_requests and all(r.target == f"/d/train-000000.tar?{SIGNED}" for r in shard_requests)


# ----------------------------------------------------------------------------- local paths


NAMES = ["a-000.tar", "b-001.tar", "notes.txt", "sub/c-000.tar"]


@pytest.fixture
def shard_dir(tmp_path):
    for name in NAMES:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(tar_bytes([(f"{name.split('.')[0].replace('/', '_')}.txt", b"x")]))
    return tmp_path


def test_a_local_directory_is_read_like_a_prefix(shard_dir):
    root = str(shard_dir)
    expected = [f"{root}/a-000.tar", f"{root}/b-001.tar", f"{root}/sub/c-000.tar"]
    assert list_shards(root) == expected
    assert list_shards(root + "/") == expected
    assert list_shards(f"file:{root}") == [f"file:{path}" for path in expected]
    local = lister_for(root + "/a-")
    assert local is not None and list(local(root + "/a-", SourceOptions())) == [f"{root}/a-000.tar"]
    assert sorted(local(f"file:{root}/", SourceOptions())) == [f"file:{root}/{name}" for name in NAMES]
    for named in (root + "/", root, f"file:{root}"):
        keys = [sample["__key__"] for sample in wdsx.WebDataset(named, shardshuffle=False)]
        assert keys == ["a-000", "b-001", "sub_c-000"], named


def test_a_directory_opened_as_a_shard_says_how_to_name_its_shards(shard_dir):
    with pytest.raises(
        SourceError,
        match=rf"is a directory, not a shard: name its shards {shard_dir}/ or {shard_dir}/\*\.tar",
    ):
        open_source(str(shard_dir))


def test_what_names_several_shards(shard_dir):
    assert names_several(str(shard_dir)) and names_several(f"{shard_dir}/a-*.tar")
    assert not names_several(f"{shard_dir}/a-000.tar") and not names_several(f"{shard_dir}/none.tar")
    assert not names_several("https://host/d/") and not names_several("pipe:cat d/*.tar")


def test_missing_local_shards_are_found_before_reading(shard_dir):
    urls = wdsx.expand_urls(f"{shard_dir}/{{a-000,b-001,b-002}}.tar")
    assert missing_local_shards(urls + ["https://host/x.tar", "pipe:cat x.tar"]) == [f"{shard_dir}/b-002.tar"]
    assert missing_local_shards([f"file:{shard_dir}/a-000.tar", f"file:{shard_dir}/zz.tar"]) == [
        f"file:{shard_dir}/zz.tar"
    ]


def test_a_missing_shard_is_reported_before_the_first_batch(shard_dir):
    """The probe: a typo at the end of a brace range used to show only after the epoch."""
    pattern = f"{shard_dir}/{{a-000,b-001,b-002}}.tar"
    with pytest.raises(SourceError) as caught:
        wdsx.WebDataset(pattern, shardshuffle=False)
    missing = f"{shard_dir}/b-002.tar"
    assert str(caught.value) == f"{missing}: 1 of 3 local shards do not exist: {missing}"


def test_many_missing_shards_are_counted_and_a_few_named(shard_dir):
    names = [f"{shard_dir}/gone-{i}.tar" for i in range(5)]
    with pytest.raises(SourceError) as caught:
        wdsx.WebDataset([f"{shard_dir}/a-000.tar", *names])
    listed = ", ".join(names[:3])
    assert str(caught.value) == f"{names[0]}: 5 of 6 local shards do not exist: {listed} and 2 more"


def test_a_continuing_handler_is_warned_of_missing_shards_and_reads_the_others(shard_dir, caplog):
    pattern = f"{shard_dir}/{{a-000,b-002,b-001}}.tar"
    with caplog.at_level(logging.WARNING, logger="wdsx"):
        dataset = wdsx.WebDataset(pattern, shardshuffle=False, handler=wdsx.warn_and_continue)
        warned = [record.getMessage() for record in caplog.records]
        assert len(warned) == 1 and "1 of 3 local shards do not exist" in warned[0]
        assert [sample["__key__"] for sample in dataset] == ["a-000", "b-001"]
