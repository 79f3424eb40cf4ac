"""Prove that a pipeline, with its own maps, resumes exactly: ``wdsx.check_resume``.

The checker builds the user's loader again and again with the user's own function and compares
what it yields, bit for bit, with an uninterrupted run: a second uninterrupted run (is the
pipeline deterministic at all?), one run cut at each cut point (the state taken there, turned
into JSON and back, and loaded into a freshly built loader, as after a crash), and one run cut
at every cut point in turn (resumed again and again). The first difference names the run, the
batch, the sample (its key and position) and, by running ever longer prefixes of the dataset's
stages in this process, the first stage whose output differs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wdsx.loader.compare import difference, rows
from wdsx.loader.webloader import WebLoader
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.stages.base import source_index
from wdsx.state.position import Position

PROBE_ITEMS = 256
"""Items of each stage prefix compared when looking for the stage where runs part."""

Recording = list[tuple[Any, Any]]
"""What a run yielded: each item with the position(s) of its samples."""


@dataclass(frozen=True)
class Difference:
    """Where a run first parted from the uninterrupted one."""

    run: str
    """Which run: ``"second uninterrupted run"``, ``"resumed after batch 7"``..."""
    batch: int
    """Index of the first differing item (batch) in the run, counted from the start."""
    detail: str
    """What differs, e.g. ``"[0]: tensor values differ"`` (element 0 of a tuple batch)."""
    key: str | None = None
    """The ``__key__`` of the first differing sample in that batch, when known."""
    position: Position | None = None
    """That sample's position (shard URL, byte offset, ordinal, padding)."""
    stage: str | None = None
    """The first stage of the dataset whose output differs in the same way, when found."""

    def __str__(self) -> str:
        text = f"{self.run}: batch {self.batch} differs ({self.detail})"
        if self.key is not None or self.position is not None:
            where = f" of {self.position.url} #{self.position.ordinal}" if self.position is not None else ""
            text += f"; first differing sample {self.key!r}{where}"
        if self.stage is not None:
            text += f"; first stage whose output differs: {self.stage}"
        return text


@dataclass(frozen=True)
class ResumeReport:
    """The outcome of :func:`check_resume`."""

    batches: int
    """Items (batches) of the uninterrupted run."""
    cuts: tuple[int, ...]
    """The cut points tried: states taken after this many batches."""
    runs: tuple[str, ...]
    """The runs compared with the uninterrupted run, in order (up to the first difference)."""
    difference: Difference | None

    @property
    def identical(self) -> bool:
        """True when every run yielded exactly what the uninterrupted run yielded."""
        return self.difference is None

    def __str__(self) -> str:
        runs = f"{len(self.runs)} run{'s' if len(self.runs) != 1 else ''}"
        head = f"{self.batches} batches; {runs} compared ({', '.join(self.runs)})"
        if self.difference is None:
            return f"resumes exactly: {head}"
        return f"NOT exactly resumable: {head}\n{self.difference}"


def check_resume(
    make_loader: Callable[[], DataPipeline],
    cuts: int | Sequence[int] = 3,
    epochs: int = 1,
    limit: int | None = None,
) -> ResumeReport:
    """Run the loader ``make_loader()`` builds (a ``WebLoader``, ``WebDataset`` or any wdsx
    pipeline; a new one each call) uninterrupted and cut-and-resumed, and report the first
    difference.

    Args:
        make_loader: builds the loader, as the training script does.
        cuts: batch counts after which to take a state and resume from it in a new loader;
            an int asks for that many cut points spread over the run, plus every epoch
            boundary inside it. A ValueError when none falls inside the run (nothing would
            be compared).
        epochs: ``iter()`` passes that make up a run.
        limit: compare only the first ``limit`` batches (needed for endless loaders).
    """
    reference, pass_ends = record(make_loader, epochs, limit, [])
    total = len(reference)
    points = _cut_points(cuts, total, pass_ends)
    outside = [] if isinstance(cuts, int) else sorted(set(cuts) - set(points))
    if outside and points:
        raise ValueError(
            f"cuts after {', '.join(map(str, outside))} fall outside the run of {total} batches; "
            "a cut is a batch count between 1 and the run's length minus 1"
        )
    if not points:
        asked = f"{cuts} cut points" if isinstance(cuts, int) else f"cuts after {', '.join(map(str, cuts))}"
        raise ValueError(
            f"nothing to compare: the run yields {total} batches, and no cut falls inside it ({asked}); "
            "a cut is a batch count between 1 and the run's length minus 1"
        )
    plans: list[tuple[str, list[int]]] = [("second uninterrupted run", [])]
    plans += [(f"resumed after batch {c}", [c]) for c in points]
    if len(points) > 1:
        plans.append((f"resumed after batches {', '.join(map(str, points))} in turn", points))
    done: list[str] = []
    for name, plan in plans:
        done.append(name)
        found = first_difference(reference, record(make_loader, epochs, total, plan)[0])
        if found is not None:
            index, detail, position = found
            row = _row(*reference[index], position) if position is not None else None
            key = _key_of(row, position, make_loader)
            found_at = Difference(name, index, detail, key, position, first_differing_stage(make_loader))
            return ResumeReport(total, tuple(points), tuple(done), found_at)
    return ResumeReport(total, tuple(points), tuple(done), None)


def record(
    make_loader: Callable[[], DataPipeline], epochs: int, total: float | None, cuts: Sequence[int]
) -> tuple[Recording, list[int]]:
    """What a run yields: ``epochs`` passes of a loader (at most ``total`` items), replaced by a
    new loader resumed from a JSON round trip of its state after each of ``cuts`` items; and
    the item counts at which passes ended."""
    items: Recording = []
    ends: list[int] = []
    state = None
    passes = epochs  # passes not finished yet, the one a state is inside included
    for number, stop in enumerate([*cuts, float("inf") if total is None else total]):
        loader = make_loader()
        if not isinstance(loader, DataPipeline):
            raise ValueError(
                f"{getattr(make_loader, '__name__', make_loader)!r} returned {loader!r:.60}, "
                "not a wdsx loader or pipeline (a WebLoader, WebDataset or DataPipeline)"
            )
        if state is not None:
            loader.load_state_dict(state)
        try:
            while len(items) < stop and passes > 0:
                for item in loader:
                    items.append((item, loader.current_position()))
                    if len(items) == stop:
                        break
                else:
                    passes -= 1
                    ends.append(len(items))
            if number < len(cuts):
                state = json.loads(json.dumps(loader.state_dict()))
        finally:
            loader.close()
    return items, ends


def first_difference(reference: Recording, run: Recording) -> tuple[int, str, Position | None] | None:
    """(index, what differs, position of the first differing sample) of the first item of
    ``run`` that differs from ``reference``'s, or None when the runs are identical."""
    for index, ((expected, where), (got, got_where)) in enumerate(zip(reference, run)):
        detail = difference(expected, got)
        if detail is None and where != got_where:
            detail = "same values, but from other samples (positions differ)"
        if detail is not None:
            return index, detail, _differing_position(expected, got, where, got_where)
    if len(reference) != len(run):
        ended = f"this run ended after {len(run)} batches, the uninterrupted one after {len(reference)}"
        return min(len(reference), len(run)), ended, None
    return None


def first_differing_stage(make_loader: Callable[[], DataPipeline]) -> str | None:
    """The first stage of the dataset whose output, in this process, differs between runs of
    the stages up to it (uninterrupted twice, and cut in the middle); None when none does (the
    difference then comes from a WebLoader's workers or main-process stages)."""
    dataset = _dataset_of(make_loader())
    start = source_index(dataset.pipeline) if dataset is not None else None
    if dataset is None or start is None:
        return None
    for end in range(start + 1, len(dataset.pipeline) + 1):
        prefix = _prefix_factory(make_loader, end)
        reference = record(prefix, 1, PROBE_ITEMS, [])[0]
        for cuts in ([], [len(reference) // 2]):
            if first_difference(reference, record(prefix, 1, len(reference), cuts)[0]) is not None:
                return f"stage {end - 1}: {dataset.pipeline[end - 1].describe()}"
    return None


def _prefix_factory(make_loader: Callable[[], DataPipeline], end: int) -> Callable[[], DataPipeline]:
    """Builds the loader's dataset cut down to its first ``end`` stages, run in this process."""

    def make() -> DataPipeline:
        dataset = _dataset_of(make_loader())
        assert dataset is not None, "only called for loaders of wdsx pipelines"
        prefix = dataset.detached()
        prefix.pipeline = list(dataset.pipeline[:end])
        return prefix

    return make


def _cut_points(cuts: int | Sequence[int], total: int, epoch_ends: list[int]) -> list[int]:
    if isinstance(cuts, int):
        spread = {round(total * (i + 1) / (cuts + 1)) for i in range(cuts)}
        chosen = spread | set(epoch_ends)
    else:
        chosen = set(cuts)
    return sorted(c for c in chosen if 0 < c < total)


def _differing_position(expected: Any, got: Any, where: Any, got_where: Any) -> Position | None:
    if isinstance(where, Position):
        return where
    if not isinstance(where, list):
        return None
    expected_rows, got_rows = rows(expected, len(where)), rows(got, len(where))
    if expected_rows is None or got_rows is None or not isinstance(got_where, list):
        return None
    for index, (a, b) in enumerate(zip(expected_rows, got_rows)):
        position = where[index]
        if difference(a, b) is not None or position != got_where[index]:
            return position if isinstance(position, Position) else None
    return None


def _dataset_of(loader: DataPipeline) -> DataPipeline | None:
    """The pipeline that reads the samples: a WebLoader's dataset, or the loader itself."""
    dataset = loader.dataset if isinstance(loader, WebLoader) else loader
    return dataset if isinstance(dataset, DataPipeline) else None


def _row(item: Any, where: Any, position: Position) -> Any:
    """The row of ``item`` that holds the sample at ``position``."""
    if isinstance(where, list) and position in where:
        found = rows(item, len(where))
        return found[where.index(position)] if found is not None else None
    return item


def _key_of(row: Any, position: Position | None, make_loader: Callable[[], DataPipeline]) -> str | None:
    """The sample's key: from its row when the row carries one, else read at its position."""
    if isinstance(row, dict) and isinstance(row.get("__key__"), str):
        return row["__key__"]
    if position is None:
        return None
    dataset = _dataset_of(make_loader())
    index = source_index(dataset.pipeline) if dataset is not None else None
    if dataset is None or index is None or not dataset.pipeline[index].reads_shards:
        return None
    sample = dataset.pipeline[index].read_positions([position])[0]
    return sample.get("__key__") if isinstance(sample, dict) else None
