"""The HTTP surface: tar shards served by a misbehaving HTTP server in the worker process.

Each input is a base shard (:mod:`tests.fuzz.corpus`, plain or compressed), possibly mutated,
and a way of serving it, answered to every request of the input (retries included): a wrong,
missing, doubled or malformed ``Content-Length``; chunked framing, whole or damaged; error and
odd statuses; damaged, overlong or too many header lines; a body cut short, followed by
garbage, or endless; a server that stalls, trickles, or hangs up before answering; ``Range``
honoured or ignored. wdsx reads it with few, quick retries and a short stall window.

The oracle is the tar verdict (:mod:`tests.fuzz.oracle`) of the body a correct HTTP client
sees (the shard; or what a short ``Content-Length``, a cut or damaged chunks leave of it). When the reply
is correct HTTP (:attr:`Input.proper`), wdsx must give exactly that verdict's samples (or a
``ShardError`` on a damaged shard); when it is not, a wdsx error (``SourceError`` or
``ShardError``), or exactly the samples that body or the undamaged shard holds
(``tolerated``).
"""

from __future__ import annotations

import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import wdsx
from tests.fuzz import corpus, mutate, oracle
from tests.fuzz.outcomes import Reading, attempt, describe, first_failure
from tests.fuzz.surfaces import FuzzInput
from tests.fuzz.surfaces.tar import plain
from wdsx.core.errors import NoSamplesError, WdsxError
from wdsx.sources import SourceOptions

OPTIONS = SourceOptions(timeout=1.0, stall_timeout=0.2, retries=2, backoff=0.0, prefetch=0)
ENDLESS = 32 << 20
"""How much an "endless" body sends before the server gives up (far past any shard here)."""
_SUFFIX = {None: ".tar", "gzip": ".tar.gz", "bzip2": ".tar.bz2", "xz": ".tar.xz"}


@dataclass(frozen=True)
class Input(FuzzInput):
    """One HTTP input: the shard's bytes (``data``, the body of a correct reply) and how the
    server answers each request for them."""

    suffix: str
    status: bytes = b"200 OK"
    headers: tuple[bytes, ...] = ()
    """Header lines, ``Content-Length`` or ``Transfer-Encoding`` included when sent."""
    body: bytes = b""
    """The bytes after the headers (framing included: chunks, garbage, a cut)."""
    honour_range: bool = True
    endless: bytes = b""
    """Repeated after ``body`` until the client hangs up (or :data:`ENDLESS` bytes)."""
    pause: float = 0.0
    """Seconds to stall after half the body, on the first request only."""
    trickle: bool = False
    """Send one byte every 50 ms, every time."""
    hang_up: bool = False
    """Close the connection without answering."""
    proper: bool = True
    """Whether the reply is correct HTTP (so wdsx must read it exactly)."""
    delivered: bytes | None = None
    """The body a correct client sees, when it is not the shard's bytes (a short
    ``Content-Length``, a cut, damaged chunks)."""
    original: list[dict[str, Any]] = field(default_factory=list)


def _reply(item: Input, start: int) -> tuple[bytes, bytes]:
    """The status line with headers, and the body, for a request starting at byte ``start``."""
    if start and item.honour_range and item.body == item.data and not item.headers[1:]:
        body = item.data[start:]
        head = (
            f"HTTP/1.1 206 Partial Content\r\nContent-Length: {len(body)}\r\n"
            f"Content-Range: bytes {start}-{len(item.data) - 1}/{len(item.data)}\r\n\r\n"
        ).encode()
        return head, body
    head = b"HTTP/1.1 " + item.status + b"\r\n" + b"".join(h + b"\r\n" for h in item.headers) + b"\r\n"
    return head, item.body


class Server:
    """A loopback server answering every request with the current input's reply."""

    def __init__(self) -> None:
        self.item: Input | None = None
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, item: Input) -> str:
        self.item, self.requests = item, 0
        return f"http://127.0.0.1:{self.port}/shard-{item.index}{item.suffix}"

    def _accept(self) -> None:
        while True:
            connection, _ = self._listener.accept()
            threading.Thread(target=self._answer, args=(connection, self.item), daemon=True).start()

    def _answer(self, connection: socket.socket, item: Input | None) -> None:
        with connection:
            connection.settimeout(5.0)
            try:
                request = b""
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    part = connection.recv(4096)
                    if not part:
                        return
                    request += part
                self.requests += 1
                if item is None or item.hang_up:
                    return
                self._send(connection, item, _range_start(request), self.requests == 1)
            except OSError:
                return  # the client hung up: what it does next is what is tested

    @staticmethod
    def _send(connection: socket.socket, item: Input, start: int, first: bool) -> None:
        head, body = _reply(item, start)
        if item.trickle:
            for byte in head + body:
                connection.sendall(bytes([byte]))
                time.sleep(0.05)
            return
        connection.sendall(head)
        half = len(body) // 2
        connection.sendall(body[:half])
        if item.pause and first:
            time.sleep(item.pause)
        connection.sendall(body[half:])
        sent = 0
        while item.endless and sent < ENDLESS:
            connection.sendall(item.endless)
            sent += len(item.endless)


def _range_start(request: bytes) -> int:
    for line in request.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"range" and value.strip().startswith(b"bytes="):
            first = value.strip()[6:].split(b"-")[0]
            return int(first) if first.isdigit() else 0
    return 0


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out = b""
    at = 0
    while at < len(body):
        size = rng.choice([1, 100, 512, 4096])
        out += b"%x\r\n" % len(body[at : at + size]) + body[at : at + size] + b"\r\n"
        at += size
    return out + b"0\r\n\r\n"


def _serving(rng: random.Random, data: bytes) -> tuple[str, dict[str, Any]]:
    """A way to serve ``data``: its name, and the :class:`Input` fields it sets."""
    length = b"Content-Length: %d" % len(data)
    cut = rng.randint(0, max(0, len(data) - 1))
    damaged = bytes(_damaged(rng, _chunked(data, rng)))
    ways: list[tuple[str, dict[str, Any]]] = [
        ("proper", {"headers": (length,), "body": data}),
        ("no_length", {"headers": (b"Connection: close",), "body": data}),
        ("chunked", {"headers": (b"Transfer-Encoding: chunked",), "body": _chunked(data, rng)}),
        ("garbage_after", {"headers": (length,), "body": data + rng.randbytes(rng.randint(1, 900))}),
        ("range_ignored", {"headers": (length,), "body": data, "honour_range": False, "pause": 0.5}),
        ("stall_once", {"headers": (length,), "body": data, "pause": 0.5}),
    ]
    improper: list[tuple[str, dict[str, Any]]] = [
        ("length_short", {"headers": (b"Content-Length: %d" % cut,), "body": data, "delivered": data[:cut]}),
        (
            "length_long",
            {"headers": (b"Content-Length: %d" % (len(data) + rng.choice([1, 512, 10**6])),), "body": data},
        ),
        (
            "length_bad",
            {
                "headers": (
                    b"Content-Length: "
                    + rng.choice([b"abc", b"-5", b"1e3", b"", b"99999999999999999999999"]),
                ),
                "body": data,
            },
        ),
        ("length_twice", {"headers": (length, b"Content-Length: %d" % cut), "body": data}),
        ("cut", {"headers": (length,), "body": data[:cut], "delivered": data[:cut]}),
        ("cut_no_length", {"headers": (), "body": data[:cut], "delivered": data[:cut]}),
        (
            "chunk_damage",
            {"headers": (b"Transfer-Encoding: chunked",), "body": damaged, "delivered": _unchunked(damaged)},
        ),
        (
            "status",
            {
                "status": rng.choice(
                    [
                        b"404 Not Found",
                        b"500 Oops",
                        b"503 Busy",
                        b"416 Range",
                        b"204 Empty",
                        b"206 Partial",
                        b"999 What",
                        b"abc",
                        b"301 Moved",
                    ]
                ),
                "headers": (length, b"Location: /elsewhere"),
                "body": data,
            },
        ),
        (
            "header_damage",
            {
                "headers": (
                    length,
                    rng.choice([b"no colon here", b"X: " + b"v" * 70000, b"\xff\xfe: x", b" folded"]),
                ),
                "body": data,
            },
        ),
        ("many_headers", {"headers": (length,) + tuple(b"X-%d: y" % n for n in range(150)), "body": data}),
        ("endless_zeros", {"headers": (), "body": data, "endless": bytes(65536)}),
        ("endless_noise", {"headers": (), "body": data, "endless": rng.randbytes(4096) * 16}),
        ("stall_always", {"headers": (length,), "body": data, "honour_range": False, "trickle": True}),
        ("hang_up", {"hang_up": True}),
    ]
    if rng.random() < 0.45:
        name, fields = rng.choice(
            [way for way in ways if not way[1].get("pause")] if rng.random() < 0.97 else ways
        )
        return name, fields
    name, fields = rng.choice(improper if rng.random() < 0.99 else improper[-2:])
    while name in ("stall_always",) and rng.random() < 0.9:  # the slow ones, rarely
        name, fields = rng.choice(improper[:-2])
    return name, {**fields, "proper": False}


def _unchunked(body: bytes) -> bytes:
    """The bytes a chunked body carries, up to where its framing breaks (RFC 9112: a hex size
    line, that many bytes, CRLF; a zero size ends it)."""
    out = bytearray()
    at = 0
    while True:
        end = body.find(b"\r\n", at)
        size_text = body[at:end].split(b";")[0].strip() if end >= 0 else b""
        if end < 0 or not size_text or any(c not in b"0123456789abcdefABCDEF" for c in size_text):
            return bytes(out)
        size = int(size_text, 16)
        if size == 0:
            return bytes(out)
        chunk = body[end + 2 : end + 2 + size]
        out += chunk
        if len(chunk) < size or body[end + 2 + size : end + 4 + size] != b"\r\n":
            return bytes(out)
        at = end + 4 + size


def _damaged(rng: random.Random, chunked: bytes) -> bytearray:
    return mutate.STREAM_MUTATIONS[rng.choice(sorted(mutate.STREAM_MUTATIONS))](rng, bytearray(chunked))


class HttpSurface:
    name = "http"

    def __init__(self, seed: int):
        self.bases = corpus.corpus(seed, 16)
        self.originals = [oracle.verdict(base.stored()).samples for base in self.bases]
        self.server = Server()

    def make(self, seed: int, index: int) -> Input:
        rng = random.Random(f"http:{seed}:{index}")
        number = rng.randrange(len(self.bases))
        base = self.bases[number]
        data = base.stored()
        mutations = []
        if rng.random() < 0.3:
            name = rng.choice(sorted(mutate.TAR_MUTATIONS))
            data = base.stored(bytes(mutate.TAR_MUTATIONS[name](rng, bytearray(base.tar))))
            mutations.append(name)
        way, fields = _serving(rng, data)
        return Input(
            index,
            base.name,
            (way, *mutations),
            data,
            _SUFFIX[base.compression],
            original=self.originals[number] or [],
            **fields,
        )

    def read(self, item: Input, scratch: str) -> dict[str, Reading]:
        url = self.server.url(item)
        return {
            "http": attempt(
                lambda: plain(list(wdsx.WebDataset(url, shardshuffle=False, manifest=False, options=OPTIONS)))
            )
        }

    def classify(self, item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
        failure = first_failure(readings, WdsxError)
        if failure is not None:
            return failure
        reading = readings["http"]
        verdict = oracle.verdict(item.data if item.delivered is None else item.delivered)
        if reading.error is not None:
            if isinstance(reading.error, NoSamplesError) and verdict.clean and not verdict.samples:
                return "ok", ""
            if not item.proper or not verdict.clean:
                return "error", str(reading.error)[:200]
            return "strict", str(reading.error)[:200]
        if verdict.clean and reading.result == verdict.samples:
            return ("ok" if item.proper else "tolerated"), ""
        if reading.result == item.original or (
            item.delivered is not None and _holds(item.data, reading.result)
        ):
            return "tolerated", verdict.reason[:200]  # the whole shard, its damage in ignored bytes
        return "silent-loss", f"{describe(readings)}; the body holds {len(verdict.samples or [])} samples"


def _holds(shard: bytes, samples: list[dict[str, Any]]) -> bool:
    """Whether ``samples`` are exactly what the whole ``shard`` holds: a reply whose framing
    is damaged in bytes ``http.client`` skips (it reads over a chunk's CRLF unchecked) still
    delivers the shard."""
    verdict = oracle.verdict(shard)
    return verdict.clean and samples == verdict.samples


def build(seed: int, scratch: str) -> HttpSurface:
    return HttpSurface(seed)
