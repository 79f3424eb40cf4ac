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
from typing import Any, Protocol

from tests.fuzz.outcomes import Reading

NAMES = ("tar", "jsonl", "npy", "members", "http", "states")
NEW = ("jsonl", "npy", "members", "http", "states")
"""The surfaces added after the first campaigns, which covered tar shards only."""


class Item(Protocol):
    """One fuzz input: its bytes, what it started from, and the mutations applied."""

    @property
    def data(self) -> bytes: ...

    @property
    def what(self) -> str: ...

    @property
    def mutations(self) -> tuple[str, ...]: ...


class Surface(Protocol):
    name: str

    def make(self, seed: int, index: int) -> Any: ...

    def read(self, item: Any, scratch: str) -> dict[str, Reading]: ...

    def classify(self, item: Any, readings: dict[str, Reading]) -> tuple[str, str]: ...


def build(name: str, seed: int, scratch: str) -> Surface:
    """The surface ``name``, ready to make and read inputs of ``seed`` (files go in ``scratch``)."""
    if name not in NAMES:
        raise ValueError(f"no fuzz surface {name!r}; there are {', '.join(NAMES)}")
    module = importlib.import_module(f"tests.fuzz.surfaces.{name}")
    return module.build(seed, scratch)
