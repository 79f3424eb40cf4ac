"""The checkpoint surface: real checkpoints of small pipelines (:mod:`tests.fuzz.tamper`),
tampered with (values out of range or of another type, packed positions corrupted, duplicated
or inflating to 800 MB, list items and keys removed, stage states swapped between checkpoints,
another pipeline's state, not an object at all), with or without their digest, then loaded into
a fresh pipeline and iterated.

The oracle is the uninterrupted run: a state ``load_state_dict`` accepts must give exactly the
batches that run gave after the checkpoint; any other state must be refused by
``load_state_dict`` itself with a ``StateError`` (an error while iterating is a failure, even a
``StateError``). One input in twenty is an untampered checkpoint, which must resume exactly.
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass
from typing import Any

from tests.fuzz import tamper
from tests.fuzz.outcomes import Reading, attempt, describe_error
from wdsx.errors import StateError


@dataclass(frozen=True)
class Input:
    index: int
    what: str
    mutations: tuple[str, ...]
    case: tamper.Case
    state: Any
    expected: list[list[str]]

    @property
    def data(self) -> bytes:
        return json.dumps(self.state).encode()


class StatesSurface:
    name = "states"

    def __init__(self, scratch: str):
        self.cases = tamper.standard_cases(scratch)
        self.checkpoints = [
            (case, state, rest) for case in self.cases.values() for state, rest in case.checkpoints
        ]

    def make(self, seed: int, index: int) -> Input:
        rng = random.Random(f"states:{seed}:{index}")
        case, state, rest = rng.choice([entry for entry in self.checkpoints if entry[0].name != "other"])
        keep_digest = rng.random() < 0.5
        original = copy.deepcopy(state) if keep_digest else tamper.without_digest(copy.deepcopy(state))
        if rng.random() < 0.05:
            return Input(index, case.name, ("none",), case, original, rest)
        others = [other for _, other, _ in self.checkpoints if other is not state]
        strangers = [other for owner, other, _ in self.checkpoints if owner.name != case.name]
        changed, what = tamper.tampered(original, others, strangers, rng, in_range=keep_digest)
        kind = re.split(r" at | \(", what)[0].replace(" ", "_")  # "number at $.x" -> "number"
        return Input(index, f"{case.name}{'' if keep_digest else ' unsigned'}", (kind,), case, changed, rest)

    def read(self, item: Input, scratch: str) -> dict[str, Reading]:
        pipeline = item.case.build()
        loading = attempt(lambda: pipeline.load_state_dict(item.state))
        if loading.error is not None:
            pipeline.close()
            return {"load": loading}

        def resumed() -> list[list[str]]:
            try:
                return tamper.keys_of(pipeline)
            finally:
                pipeline.close()

        return {"load": loading, "resume": attempt(resumed)}

    def classify(self, item: Input, readings: dict[str, Reading]) -> tuple[str, str]:
        loading = readings["load"]
        if isinstance(loading.error, MemoryError):
            return "over-memory", "load: MemoryError"
        if loading.error is not None:
            if isinstance(loading.error, StateError):
                return "error", str(loading.error)[:200]
            return "foreign", f"load: {describe_error(loading.error)}"
        resume = readings["resume"]
        if isinstance(resume.error, MemoryError):
            return "over-memory", "resume: MemoryError"
        if resume.error is not None:
            return "foreign", f"accepted, then while iterating: {describe_error(resume.error)}"
        if resume.result != item.expected:
            return "silent-loss", f"accepted, and resumed with {len(resume.result)} other batches"
        return ("ok" if item.mutations == ("none",) else "tolerated"), ""


def build(seed: int, scratch: str) -> StatesSurface:
    return StatesSurface(scratch)
