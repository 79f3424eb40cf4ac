"""wdsx beside the loaders a user might choose instead: webdataset, litdata, Mosaic Streaming and
torchdata.nodes, on the same JPEGs, each reading its own format (:mod:`benchmarks.peers`).

The generated ~24 KB JPEGs of :func:`benchmarks.data.jpeg_shards` are written once into each
format: tar shards (wdsx and webdataset), litdata's ``optimize`` chunks, Mosaic's MDS shards,
and one file per image for torchdata.nodes (which has no shard format: a map-style dataset over
files, the way its documentation loads images). Measured per loader:

* raw reading: samples per second of bytes, in this process, nothing decoded;
* the decode loader: to a 256x256 RGB uint8 array, batches of 64, 2 workers (DataLoader
  processes; threads for torchdata.nodes' ``ParallelMapper``, and wdsx once more with thread
  workers), samples per second and CPU time per sample of the process
  tree, beside the decoder alone in 2 processes (:mod:`benchmarks.bound`);
* peak memory: the PSS of the decode loader's process tree (:mod:`benchmarks.memory`) over one
  pass, in a fresh Python process per loader (PSS counts the pages forked workers share with
  the trainer once, not once per worker as RSS would);
* resume at 90%: from building a loader with the checkpoint taken at 90% of the epoch (each
  loader's own mechanism) to its first batch; the samples that follow are counted once;
* start-up: from building a fresh loader to its first batch.

The loaders take turns in every round and the medians are reported, each beside the best
loader's. The peers are installed by ``make bench`` only; one that is missing or fails is
reported as unavailable, with the reason, and the others go on.

    python benchmarks/bench_peers.py --samples 2000 --repeats 1
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks import bound  # noqa: E402
from benchmarks.bench_loader import cpu_seconds, run_loader  # noqa: E402
from benchmarks.memory import PeakPss  # noqa: E402
from benchmarks.peers import BATCH, PEERS, WORKERS, Images, Peer, decode, images  # noqa: E402

RESUME_AT = 0.9
Row = tuple[str, str, str, str, str]


def _release(*things: Any) -> None:
    """Close loaders and iterators now (their workers and threads stop) rather than at some
    later garbage collection, which would bill their shutdown to the next loader."""
    for thing in things:
        close = getattr(thing, "close", None)
        if callable(close):
            close()
    gc.collect()


@dataclass
class Runs:
    """Every repetition's measurements of one loader, by measure."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, measure: str, value: float) -> None:
        self.values.setdefault(measure, []).append(value)

    def median(self, measure: str) -> float | None:
        values = self.values.get(measure)
        return statistics.median(values) if values else None


def raw_rate(peer: Peer, images: Images) -> float | None:
    """Samples per second of the loader's raw reading; None where it has none of its own."""
    start = time.perf_counter()
    samples = peer.raw(images)
    if samples is None:
        return None
    count = sum(1 for _ in samples)
    return count / (time.perf_counter() - start)


def state_at(peer: Peer, images: Images, batches: int) -> Any:
    """The loader's checkpoint after ``batches`` batches."""
    loader = peer.loader(images)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = peer.checkpoint(loader)
    _release(iterator, loader)
    return state


def resumed(peer: Peer, images: Images, state: Any, to_the_end: bool = False) -> tuple[float, int]:
    """Seconds from building a loader with ``state`` to its first batch, and the samples it
    delivers: the first batch's, or (``to_the_end``) all of them."""
    start = time.perf_counter()
    loader = peer.loader(images, state)
    iterator = iter(loader)
    first = next(iterator)
    seconds = time.perf_counter() - start
    count = len(first[-1]) + (sum(len(batch[-1]) for batch in iterator) if to_the_end else 0)
    _release(iterator, loader)
    return seconds, count


@dataclass
class Result:
    """The medians of every loader that ran, the reasons of those that could not, and the
    samples each resumed loader delivered after the 90% checkpoint."""

    samples: int
    repeats: int
    runs: dict[str, Runs] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    rest: dict[str, int] = field(default_factory=dict)


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:160]


def prepare(peer: Peer, images: Images, result: Result) -> Any:
    """Write the loader's format, and take its checkpoint at 90% (None for a loader without
    one) in a pass that also warms the page cache; count what a loader resumed from it delivers."""
    peer.check()
    result.labels[peer.name] = peer.label()
    peer.prepare(images)
    if not peer.resumable:
        return None
    state = state_at(peer, images, int(images.samples * RESUME_AT) // BATCH)
    _, result.rest[peer.name] = resumed(peer, images, state, to_the_end=True)
    return state


def measure_round(peer: Peer, images: Images, state: Any, runs: Runs) -> None:
    """One turn of a loader: raw reading, a decode pass (its rate, CPU time and first batch),
    and a resumed loader's first batch."""
    if (rate := raw_rate(peer, images)) is not None:
        runs.add("raw", rate)
    count, seconds, first, cpu = run_loader(functools.partial(peer.loader, images))
    runs.add("decode", count / seconds)
    runs.add("cpu_ms", 1000 * cpu / count)
    runs.add("startup", first)
    if state is not None:
        runs.add("resume", resumed(peer, images, state)[0])


def peak_pss(peer: Peer, images: Images) -> float | None:
    """Peak PSS in MB of this process's tree (the loader's workers included) over one decode
    pass of the loader; meant for a fresh process that runs nothing else (:func:`memory_of`)."""
    with PeakPss() as peak:
        for _ in peer.loader(images):
            pass
    return peak.megabytes


def memory_of(peer: Peer, images: Images) -> float | None:
    """The peak PSS of one decode pass of the loader, measured in a fresh Python process, so
    that this process's own memory (its images, the other loaders' imports) is not counted."""
    command = [sys.executable, os.path.abspath(__file__), "--samples", str(images.samples)]
    output = subprocess.run(
        [*command, "--memory-of", peer.name], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def measure(images: Images, repeats: int, peers: tuple[Peer, ...] = PEERS) -> Result:
    """Prepare every loader, then ``repeats`` rounds in which the loaders and the bound take
    turns. A loader that fails is reported with the reason, and the others go on."""
    result = Result(images.samples, repeats)
    states: dict[str, Any] = {}
    for peer in peers:
        print(f"#   peers: preparing {peer.name}...", file=sys.stderr, flush=True)
        try:
            states[peer.name] = prepare(peer, images, result)
        except Exception as error:
            result.unavailable[peer.name] = _reason(error)
            continue
        result.runs[peer.name] = Runs()
    payloads = bound.field_bytes(images.urls, "jpg")
    result.runs["bound"] = Runs()
    for number in range(repeats):
        print(f"#   peers: round {number + 1} of {repeats}...", file=sys.stderr, flush=True)
        for peer in peers:
            if peer.name not in result.runs:
                continue
            try:
                measure_round(peer, images, states[peer.name], result.runs[peer.name])
            except Exception as error:
                result.unavailable[peer.name] = "failed while measured: " + _reason(error)
                del result.runs[peer.name]
        cpu = cpu_seconds()
        result.runs["bound"].add("decode", bound.decode_rate(payloads, decode, WORKERS))
        result.runs["bound"].add("cpu_ms", 1000 * (cpu_seconds() - cpu) / len(payloads))
    for peer in peers:
        if peer.name in result.runs and (megabytes := memory_of(peer, images)) is not None:
            result.runs[peer.name].add("pss", megabytes)
    return result


MEASURES = (
    # (key, heading, higher is better, format)
    ("raw", "raw reading, bytes, 1 process", True, lambda v: f"{v:,.0f} /s"),
    ("decode", f"decode to RGB uint8, batch {BATCH}, {WORKERS} workers", True, lambda v: f"{v:,.0f} /s"),
    ("cpu_ms", "CPU per decoded sample, process tree", False, lambda v: f"{v:.2f} ms"),
    ("pss", "peak memory of the decode loader's process tree (PSS)", False, lambda v: f"{v:,.0f} MB"),
    ("resume", "first batch after resuming at 90%", False, lambda v: f"{1000 * v:,.0f} ms"),
    ("startup", "first batch of a fresh epoch", False, lambda v: f"{1000 * v:,.0f} ms"),
)


def _best(result: Result, key: str, higher: bool) -> tuple[str, float] | None:
    values = {
        name: value
        for name, runs in result.runs.items()
        if name != "bound" and (value := runs.median(key)) is not None
    }
    if not values:
        return None
    name = (max if higher else min)(values, key=lambda n: values[n])
    return name, values[name]


def _of_best(value: float, best: float, higher: bool) -> float:
    """How a value compares with the best one: 1.0 for the best, less for the others."""
    return value / best if higher else best / value


def _label(result: Result, name: str) -> str:
    return result.labels.get(name, name)


def table(result: Result) -> str:
    """Loaders by measure, each value with its fraction of the best loader's in brackets."""
    bound_rate = result.runs["bound"].median("decode") or 0.0
    bound_cpu = result.runs["bound"].median("cpu_ms") or 0.0
    headings = ["loader", *(heading for _, heading, _, _ in MEASURES)]
    headings += ["decode / bound", "CPU: bound / loader"]
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
    for name, runs in result.runs.items():
        if name == "bound":
            continue
        cells = [_label(result, name)]
        for key, _, higher, shown in MEASURES:
            value, best = runs.median(key), _best(result, key, higher)
            if value is None or best is None:
                cells.append("no checkpoint" if key == "resume" else "")
            else:
                cells.append(f"{shown(value)} ({_of_best(value, best[1], higher):.2f})")
        rate, cpu_ms = runs.median("decode"), runs.median("cpu_ms")
        cells.append(f"{rate / bound_rate:.2f}" if rate and bound_rate else "")
        cells.append(f"{bound_cpu / cpu_ms:.2f}" if cpu_ms and bound_cpu else "")
        lines.append("| " + " | ".join(cells) + " |")
    for name, reason in result.unavailable.items():
        lines.append(f"| {_label(result, name)} | unavailable: {reason} |" + " |" * len(MEASURES))
    lines.append(
        f"\n{result.samples:,} JPEGs of ~24 KB, medians of {result.repeats} interleaved rounds; "
        f"(brackets): fraction of the best loader's value; the decoder alone in {WORKERS} processes "
        f"(the bound): {bound_rate:,.0f} /s, {bound_cpu:.2f} ms of CPU per sample."
    )
    return "\n".join(lines)


def _compared(result: Result, key: str, higher: bool, name: str) -> str:
    """The ratio cell of a row: wdsx and the peer as fractions of the best loader, and of the
    bound (decode rates) or what each resumed loader delivered (resume)."""
    best = _best(result, key, higher)
    mine, theirs = result.runs["wdsx"].median(key), result.runs[name].median(key)
    if best is None or mine is None or theirs is None:
        return ""
    text = (
        f"wdsx {_of_best(mine, best[1], higher):.2f} and {name} "
        f"{_of_best(theirs, best[1], higher):.2f} of the best ({best[0]})"
    )
    bound_rate = result.runs["bound"].median("decode")
    if key == "decode" and bound_rate:
        text += (
            f"; of the bound ({bound_rate:,.0f} /s): {mine / bound_rate:.2f} and {theirs / bound_rate:.2f}"
        )
    bound_cpu = result.runs["bound"].median("cpu_ms")
    if key == "cpu_ms" and bound_cpu:
        text += (
            f"; the bound's CPU per sample ({bound_cpu:.2f} ms) over theirs: "
            f"{bound_cpu / mine:.2f} and {bound_cpu / theirs:.2f}"
        )
    if key == "resume":
        expected = result.samples - int(result.samples * RESUME_AT) // BATCH * BATCH
        rest = result.rest
        text += (
            f"; samples after it: {rest.get('wdsx', 0):,} and {rest.get(name, 0):,} ({expected:,} expected)"
        )
    return text


def rows(result: Result) -> list[Row]:
    """The ``make bench`` rows: per measure, wdsx (wdsx column) beside each peer (the webdataset
    column), both compared with the best loader; then the peers that could not run."""
    out: list[Row] = []
    peers = [name for name in result.runs if name not in ("wdsx", "bound")] if "wdsx" in result.runs else []
    for key, heading, higher, shown in MEASURES:
        for name in peers:
            cells = [result.runs[who].median(key) for who in ("wdsx", name)]
            if cells[1] is None and key != "resume":
                continue  # a wdsx setting that reads as wdsx does
            mine, theirs = (shown(value) if value is not None else "no checkpoint" for value in cells)
            label = f"peers, {heading}: {_label(result, name)}"
            out.append((label, mine, theirs, _compared(result, key, higher, name), ""))
    for name, reason in result.unavailable.items():
        out.append((f"peers: {_label(result, name)}", "", f"unavailable: {reason}", "", ""))
    return out


def peer_rows(samples: int = 20_000, repeats: int = 5) -> list[Row]:
    """The ``peers`` section of ``make bench``: measure, print the loaders' table, return rows."""
    result = measure(images(samples), repeats)
    print(table(result), file=sys.stderr, flush=True)
    return rows(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20_000, help="JPEGs (2,000 for a smoke test)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-of", metavar="LOADER", help="only print one loader's peak PSS (MB)")
    args = parser.parse_args()
    if args.memory_of:
        (peer,) = (peer for peer in PEERS if peer.name == args.memory_of)
        print(json.dumps(peak_pss(peer, images(args.samples))))
        return
    result = measure(images(args.samples), args.repeats)
    print(table(result))
    print("\nThe rows `make bench` records:")
    print("\n".join(" | ".join(row) for row in rows(result)))


if __name__ == "__main__":
    main()
