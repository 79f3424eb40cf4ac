"""The checkpoint envelope: one reader's pipeline state, its JSON form, and its versions.

A :class:`PipelineState` holds what every stage needs in common (seed, epoch, which reader
of how many, a fingerprint of the stages) and, keyed by each stateful stage's stable name
(``"reader"``, ``"shuffle"``, ``"shuffle.2"``...), that stage's own state as JSON. Only the
stage that wrote a state parses it: each stage's state type implements :class:`StageState`.
Sample positions inside stage states are written against the envelope's URL table.

Version history: 2 keyed stage states by their index in the pipeline and held re-dealt
leftovers as ``[shard index, offset, ordinal]``; 3 keys them by name and holds positions
everywhere. Version-2 checkpoints still load: the pipeline upgrades them (it knows which
stage each index was). Version 3 later gained an optional ``digest`` (a hash of the rest of
the checkpoint, :mod:`wdsx.state.validate`) that ``state_dict()`` adds and loading checks;
states without one still load, with every field checked but no corruption check.
Three more optional fields came later, each absent from a checkpoint that does not need it
(so older checkpoints load unchanged): ``data``, the identity of the shards the checkpoint
was taken on (:mod:`wdsx.state.fingerprint`); ``skip``, outputs still to drop when the
pipeline resumes; and ``skip_keys``, the sample keys the pipeline never delivers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from wdsx.core.errors import StateError
from wdsx.state import fingerprint as data_fingerprint
from wdsx.state import validate
from wdsx.state.position import Position, PositionTable
from wdsx.state.validate import check_digest, invalid, mapping, within

FORMAT = "wdsx-state"
VERSION = 3
OLDEST_VERSION = 2

JsonDict = dict[str, Any]
Upgrade = Callable[[JsonDict], JsonDict]

S = TypeVar("S", bound="StageState")


class StageState(Protocol):
    """The typed state of one stateful stage. A fresh state comes from the no-argument
    constructor; :meth:`to_json` and :meth:`from_json` are its only (de)serialisation."""

    def to_json(self, table: PositionTable) -> JsonDict:
        """The state as JSON, positions written against ``table``."""
        ...

    @classmethod
    def from_json(cls: type[S], data: JsonDict, table: PositionTable) -> S:
        """The state :meth:`to_json` wrote."""
        ...

    def held(self) -> list[Position]:
        """Positions of samples this stage has read but not yet passed on (for re-dealing)."""
        ...


@dataclass
class PipelineState:
    """One reading stream's checkpoint of one pipeline."""

    fingerprint: list[str]
    seed: int
    consumer: int
    consumers: int
    epoch: int
    stages: dict[str, JsonDict] = field(default_factory=dict)
    urls: list[str] = field(default_factory=list)
    nominal: int = 0
    """Items already taken from the current ``with_epoch(n)`` pass."""
    passes: int = 0
    """Passes of ``repeat(n)`` still to run, the current one included."""
    finished: bool = False
    """This reader's share of the epoch is exhausted: set by WebLoader workers, and by a
    pipeline in another DataLoader's worker once its iteration ended (a state loaded with it
    delivers nothing, and the next iteration starts the next epoch)."""
    yielded: int = 0
    """Items the pipeline has yielded in this epoch (what ``len()`` of a resumed one subtracts)."""
    data: JsonDict | None = None
    """The shards' identities when the state was taken (:mod:`wdsx.state.fingerprint`)."""
    skip: int = 0
    """Outputs still to read and drop when the pipeline resumes (``pipeline.skip(n)``)."""
    skip_keys: list[str] = field(default_factory=list)
    """Keys of samples the pipeline never delivers (``pipeline.skip_keys(keys)``), sorted."""

    def table(self) -> PositionTable:
        """The URL table stage states wrote their positions against."""
        return PositionTable(self.urls)

    def to_json(self) -> JsonDict:
        data: JsonDict = {
            "format": FORMAT,
            "version": VERSION,
            "fingerprint": {"stages": list(self.fingerprint)},
            "seed": self.seed,
            "topology": [self.consumer, self.consumers],
            "epoch": self.epoch,
            "stages": dict(self.stages),
            "nominal": self.nominal,
            "passes": self.passes,
            "urls": list(self.urls),
            "yielded": self.yielded,
        }
        if self.finished:
            data["finished"] = True
        if self.data is not None:
            data["data"] = self.data
        if self.skip:
            data["skip"] = self.skip
        if self.skip_keys:
            data["skip_keys"] = list(self.skip_keys)
        return data

    @classmethod
    def from_json(cls, data: Any, upgrade: Upgrade | None = None) -> PipelineState:
        """Parse a checkpoint, checking every envelope field (stage states are checked by their
        own types, see :meth:`StageState.from_json`) and the digest when it has one; an older
        version goes through ``upgrade`` first. Raises :class:`StateError` naming the field."""
        version = check_format(data, FORMAT)
        check_digest(data)
        if version < VERSION:
            if upgrade is None:
                raise StateError(f"{FORMAT} version {version} needs the pipeline it came from to upgrade")
            data = upgrade(data)
        fingerprint = validate.field(data, "fingerprint")
        with within("fingerprint"):
            mapping(fingerprint, "an object with the stages' descriptions")
            descriptions = _strings(fingerprint, "stages", "a stage description (a string)")
        consumer, consumers = validate.integers(data, "topology", length=2)
        if consumers < 1 or consumer >= consumers:
            raise invalid("topology", "[reader, readers] with 0 <= reader < readers", [consumer, consumers])
        saved_stages = validate.field(data, "stages", {})
        with within("stages"):
            mapping(saved_stages, "an object of stage states by stage name")
            for key, saved in saved_stages.items():
                if not isinstance(saved, dict):
                    raise invalid(key, "a stage state (an object)", saved)
        urls = _strings(data, "urls", "a URL (a string)", [])
        if len(set(urls)) != len(urls):
            raise invalid("urls", "a table that lists each URL once", urls)
        passes = data.get("passes")
        shards = validate.field(data, "data", None)
        if shards is not None:
            data_fingerprint.parse(shards)
        return cls(
            fingerprint=descriptions,
            seed=validate.integer(data, "seed", low=None, high=None),
            consumer=consumer,
            consumers=consumers,
            epoch=validate.integer(data, "epoch"),
            stages=dict(saved_stages),
            urls=list(urls),
            nominal=validate.integer(data, "nominal", default=0),
            passes=0 if passes is None else validate.integer(data, "passes", high=None),
            finished=validate.boolean(data, "finished", default=False),
            yielded=validate.integer(data, "yielded", default=0),
            data=shards,
            skip=validate.integer(data, "skip", default=0),
            skip_keys=sorted(_strings(data, "skip_keys", "a sample key (a string)", [])),
        )


def _strings(data: JsonDict, key: str, what: str, default: Any = validate.MISSING) -> list[str]:
    """A list field of strings (``what`` says what each one is)."""
    values = validate.listing(data, key, default)
    for index, value in enumerate(values):
        if not isinstance(value, str):
            raise validate.InvalidState([key, index], what, value)
    return list(values)


def check_format(data: Any, expected: str) -> int:
    """The version of a checkpoint in format ``expected``; :class:`StateError` unless it is
    one this wdsx reads."""
    if not isinstance(data, dict) or data.get("format") != expected:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise StateError(f"not a {expected} checkpoint (found {found!r})")
    version = data.get("version")
    if not isinstance(version, int) or not OLDEST_VERSION <= version <= VERSION:
        raise StateError(
            f"{expected} version {version} cannot be read by this wdsx "
            f"(reads versions {OLDEST_VERSION} to {VERSION})"
        )
    return version


def fingerprint_differences(saved: list[str], current: list[str]) -> list[str]:
    """Human-readable differences between two pipelines' stage descriptions, each naming the
    innermost part that differs (``batched(16, ...)`` where a whole loader's description would
    make the reader compare two long lines by eye)."""
    problems = []
    for i, (a, b) in enumerate(zip(saved, current)):
        if a == b:
            continue
        part_a, part_b = differing_part(a, b)
        where = "" if part_a == a else f" (in {_head(a)}(...))"
        problems.append(f"stage {i} differs{where}: checkpoint has {part_a}, pipeline has {part_b}")
    if len(saved) != len(current):
        problems.append(f"checkpoint has {len(saved)} stages, pipeline has {len(current)}")
    return problems


def differing_part(a: str, b: str) -> tuple[str, str]:
    """The innermost calls of two stage descriptions that differ, as a pair: within calls of
    the same name and number of arguments (``loader(shards(...), batched(16, ...))``), the one
    argument that differs, searched again while it is a call itself (``batched(16, ...)``, not
    ``16``); otherwise the descriptions themselves."""
    call_a, call_b = _call(a), _call(b)
    if call_a is None or call_b is None or call_a[0] != call_b[0]:
        return a, b
    args_a, args_b = _arguments(call_a[1]), _arguments(call_b[1])
    differing = [(x, y) for x, y in zip(args_a, args_b) if x != y]
    if len(args_a) != len(args_b) or len(differing) != 1:
        return a, b
    x, y = differing[0]
    return differing_part(x, y) if _call(x) is not None and _call(y) is not None else (a, b)


def _head(text: str) -> str:
    return text.split("(", 1)[0]


def _call(text: str) -> tuple[str, str] | None:
    """``name(arguments)`` as (name, arguments); None for anything else."""
    opening = text.find("(")
    if opening <= 0 or not text.endswith(")"):
        return None
    return text[:opening], text[opening + 1 : -1]


def _arguments(text: str) -> list[str]:
    """The comma-separated items of a call's arguments, commas inside brackets kept."""
    items, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:position].strip())
            start = position + 1
    items.append(text[start:].strip())
    return items
