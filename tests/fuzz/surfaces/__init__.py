"""The surfaces a fuzz campaign attacks, each with its own inputs, readings and oracle:

- ``tar`` (:mod:`.tar`): mutated tar shards, plain and compressed, read as samples;
- ``jsonl`` (:mod:`.jsonl`): mutated JSONL shards, plain and compressed, against ``json.loads``;
- ``npy`` (:mod:`.npy`): mutated ``.npy`` shards against ``np.load``;
- ``members`` (:mod:`.members`): tar shards whose fields are gzip-compressed (damaged, or
  decompression bombs), and ``.tar.gz``/``.tar.bz2`` shards whose members inflate past the
  limits, decoded against the standard library's decompressors and parsers;
- ``http`` (:mod:`.http`): tar shards served by a misbehaving HTTP server (broken framing,
  headers, statuses, truncations, endless or stalling bodies), against the bytes HTTP's
  framing rules deliver;
- ``states`` (:mod:`.states`): tampered checkpoints, against the uninterrupted run.

A surface is built once per worker process (``build(seed, scratch)``: its corpus, its server)
and then, for input ``index``: ``make`` builds the input (a pure function of seed and index),
``read`` reads it every way under the watchdog, ``classify`` gives its outcome class
(:mod:`tests.fuzz.outcomes`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tests.fuzz.outcomes import Reading

NAMES = ("tar", "jsonl", "npy", "members", "http", "states")
NEW = ("jsonl", "npy", "members", "http", "states")
"""The surfaces added after the first campaigns, which covered tar shards only."""


@dataclass(frozen=True)
class FuzzInput:
    """What every fuzz input has (a surface's own inputs add their fields)."""

    index: int
    what: str
    """What the input started from (a base shard, an array, a checkpoint...)."""
    mutations: tuple[str, ...]
    data: bytes
    """The input's bytes (what ``--save`` writes)."""


class Surface(Protocol):
    name: str

    def make(self, seed: int, index: int) -> Any: ...

    def read(self, item: Any, scratch: str) -> dict[str, Reading]: ...

    def classify(self, item: Any, readings: dict[str, Reading]) -> tuple[str, str]: ...


@dataclass(frozen=True)
class Functions:
    """A surface that needs nothing built per worker: its three functions."""

    name: str
    make: Callable[[int, int], Any]
    read: Callable[[Any, str], dict[str, Reading]]
    classify: Callable[[Any, dict[str, Reading]], tuple[str, str]]


def build(name: str, seed: int, scratch: str) -> Surface:
    """The surface ``name``, ready to make and read inputs of ``seed`` (files go in ``scratch``)."""
    if name not in NAMES:
        raise ValueError(f"no fuzz surface {name!r}; there are {', '.join(NAMES)}")
    module = importlib.import_module(f"tests.fuzz.surfaces.{name}")
    return module.build(seed, scratch)
