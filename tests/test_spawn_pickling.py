"""Pipelines pickle, as webdataset's do.

A DataLoader whose workers start with ``spawn`` or ``forkserver`` (the default on macOS and
Windows) sends each worker the dataset pickled, so every stage, and every function a stage
holds, must pickle. Each stage factory of the functional and fluent APIs is pickled and
unpickled here with typical arguments, then run on the same input as webdataset 1.0.2's stage
of the same name (the oracle); a pipeline using the stages that once held closures runs under
``WebLoader`` and ``DataLoader`` with spawned workers, against webdataset run the same way.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch.utils.data
import webdataset

import wdsx
from tests.fixtures.shards import Shards, make_shards
from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.samples import POSITION

# --- functions the stages hold: module-level, so that they pickle in either library --------


def plus_one(value: int) -> int:
    return value + 1


def shout(text: str) -> str:
    return text.upper()


def read_label(stream: Any) -> int:
    """An ``xdecode`` reader: the stream's bytes as an integer."""
    return int(stream.read())


def with_length_field(sample: dict) -> dict:
    return {**sample, "length": len(sample["txt"])}


def has_even_label(sample: dict) -> bool:
    return sample["cls"] % 2 == 0


def shard_of(key: str) -> dict:
    """An ``associate`` look-up: the extra fields of the sample with this key."""
    return {"shard": key.split("/")[0]}


def as_dict(item: tuple) -> dict:
    return {"__key__": item[0], "label": item[1], "caption": item[2], "shard": item[3]}


def keep_every(src: Iterator, n: int, offset: int = 0) -> Iterator:
    """A user's stage for ``pipelinefilter``: every ``n``-th item from ``offset`` on."""
    for index, item in enumerate(src):
        if index % n == offset:
            yield item


def comparable(value: Any) -> Any:
    """``value`` in a form ``==`` compares: arrays as lists, tuples as lists, and samples
    without the two fields wdsx adds on purpose (``__position__``, ``__epoch_seed__``)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in (POSITION, EPOCH_SEED)}
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.tolist())
    return value


def round_trip(obj: Any) -> Any:
    return pickle.loads(pickle.dumps(obj))


def run_stage(stage: Any, items: list) -> list:
    """A stage's output on ``items``: a curried function is called on their iterator, a
    webdataset ``PipelineStage`` runs on it."""
    source = iter(copy.deepcopy(items))
    return list(stage(source) if callable(stage) else stage.run(source))


# --- the functional API: each stage on a plain iterator -----------------------------------

RAW = [
    {"__key__": f"s000/{i:05d}", "__url__": "shard-000000.tar", "cls": str(i).encode(), "txt": b"a%d" % i}
    for i in range(6)
]
"""Samples as a reader makes them: bytes fields."""

DECODED = [{**sample, "cls": i, "txt": f"a{i}"} for i, sample in enumerate(RAW)]
TUPLES = [(f"a{i}", i) for i in range(6)]
BATCHES = [[("a0", 0), ("a1", 1)], [("a2", 2)]]

INPUTS = {"raw": RAW, "decoded": DECODED, "tuples": TUPLES, "batches": BATCHES}


@dataclass
class StageCase:
    name: str
    make: Callable[[ModuleType], Any]
    """The stage, given the library (``wdsx`` or ``webdataset``)."""
    given: str
    """Which of :data:`INPUTS` it runs on."""
    compare: str = "exact"
    """How outputs compare: "exact", "sorted" (a random order of the same items), or "none"
    (random choices, which the two libraries draw differently)."""


STAGES = [
    StageCase("map", lambda lib: lib.map(with_length_field), "decoded"),
    StageCase("map_dict", lambda lib: lib.map_dict(cls=plus_one, txt=shout), "decoded"),
    StageCase("map_tuple", lambda lib: lib.map_tuple(shout, plus_one), "tuples"),
    StageCase("to_tuple", lambda lib: lib.to_tuple("txt", "jpg;cls"), "decoded"),
    StageCase("to_tuple_spec", lambda lib: lib.to_tuple("__key__ txt;jpg cls"), "decoded"),
    StageCase("to_tuple_optional", lambda lib: lib.to_tuple("txt", "png", missing_is_error=False), "decoded"),
    StageCase("rename", lambda lib: lib.rename(caption="txt", label="cls"), "decoded"),
    StageCase("rename_dropping", lambda lib: lib.rename(caption="txt", keep=False), "decoded"),
    StageCase("rename_keys", lambda lib: lib.rename_keys(caption="txt", keep_unselected=True), "decoded"),
    StageCase("extract_keys", lambda lib: lib.extract_keys("txt", "*.cls"), "decoded"),
    StageCase("xdecode", lambda lib: lib.xdecode(cls=read_label), "raw"),
    StageCase("xdecode_pairs", lambda lib: lib.xdecode(("*.cls", False), must_decode=False), "raw"),
    StageCase("associate_function", lambda lib: lib.associate(shard_of), "decoded"),
    StageCase("associate_dict", lambda lib: lib.associate({"s000/00001": {"extra": 1}}), "decoded"),
    StageCase("decode", lambda lib: lib.decode(), "raw"),
    StageCase("decode_image_spec", lambda lib: lib.decode("rgb8"), "raw"),
    StageCase("select", lambda lib: lib.select(has_even_label), "decoded"),
    StageCase("slice", lambda lib: lib.slice(1, 5, 2), "decoded"),
    StageCase("info", lambda lib: lib.info(n=0), "decoded"),
    StageCase("log_keys", lambda lib: lib.filters.log_keys(), "decoded"),
    StageCase("batched", lambda lib: lib.batched(4), "tuples"),
    StageCase("unbatched", lambda lib: lib.unbatched(), "batches"),
    StageCase("unlisted", lambda lib: lib.filters.unlisted(), "batches"),
    StageCase("Cached", lambda lib: lib.Cached(), "decoded"),
    StageCase("pipelinefilter", lambda lib: lib.pipelinefilter(keep_every)(2, offset=1), "decoded"),
    StageCase("compose", lambda lib: lib.map_tuple(None, lib.filters.compose(plus_one, plus_one)), "tuples"),
    StageCase("shuffle", lambda lib: lib.shuffle(4), "decoded", "sorted"),
    StageCase("detshuffle", lambda lib: lib.detshuffle(4), "decoded", "sorted"),
    StageCase("rsample", lambda lib: lib.rsample(0.5), "decoded", "none"),
]


@pytest.mark.parametrize("case", STAGES, ids=lambda case: case.name)
def test_stage_pickles_and_runs_as_webdataset_does(case: StageCase) -> None:
    stage = case.make(wdsx)
    restored = round_trip(stage)
    assert restored.describe() == stage.describe(), "the checkpoint fingerprint changed"
    given = INPUTS[case.given]
    ours = comparable(run_stage(restored, given))
    theirs = comparable(run_stage(case.make(webdataset), given))
    if case.compare == "exact":
        assert ours == theirs
    elif case.compare == "sorted":
        assert sorted(ours, key=repr) == sorted(theirs, key=repr)


def test_listed_pickles() -> None:
    """``listed`` (webdataset has it only as a fluent method): lists of items, unchanged."""
    restored = round_trip(wdsx.listed(4))
    assert list(restored(iter(TUPLES))) == [TUPLES[:4], TUPLES[4:]]


def test_xdecode_matches_webdataset_on_directory_names() -> None:
    """A field named like a directory path is decoded by its last part, and a last part
    starting with ``__`` is passed as a stream, as webdataset's ``find_decoder`` does."""
    sample = {"__key__": "k", "a/b.txt": b"text", "a/__meta": b"raw", "c.BIN": b"bin"}
    ours = round_trip(wdsx.xdecode())(iter([dict(sample)]))
    theirs = webdataset.xdecode()(iter([dict(sample)]))
    for mine, oracle in zip(ours, theirs):
        assert mine.pop("a/__meta").read() == oracle.pop("a/__meta").read()
        assert mine == oracle


# --- whole pipelines: functional and fluent ------------------------------------------------


@pytest.fixture(scope="module")
def small_shards(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    return make_shards(str(tmp_path_factory.mktemp("pickling")), [5, 4, 6, 5])


def functional(lib: ModuleType, urls: list[str], *stages: Any) -> Any:
    return lib.DataPipeline(lib.SimpleShardList(urls), lib.split_by_worker, lib.tarfile_to_samples(), *stages)


PIPELINES: dict[str, Callable[[ModuleType, list[str]], Any]] = {
    "shard_list_stages": lambda lib, urls: lib.DataPipeline(
        lib.SimpleShardList(urls),
        lib.single_node_only,
        lib.split_by_node,
        lib.split_by_worker,
        lib.non_empty,
        lib.tarfile_to_samples(),
        lib.decode(),
        lib.to_tuple("__key__", "cls"),
    ),
    "sample_stages": lambda lib, urls: functional(
        lib,
        urls,
        lib.xdecode(cls=read_label),
        lib.associate(shard_of),
        lib.rename_keys(label="cls", text="txt", keep_unselected=True),
        lib.rename(caption="text"),
        lib.map_dict(label=plus_one),
        lib.to_tuple("__key__", "label", "caption", "shard"),
        lib.map_tuple(None, plus_one, shout, None),
        lib.map(as_dict),
        lib.extract_keys("__key__", "label", "caption", "shard"),
        lib.pipelinefilter(keep_every)(2),
    ),
    "batching": lambda lib, urls: functional(
        lib, urls, lib.decode(), lib.to_tuple("txt", "cls"), lib.batched(3), lib.unbatched()
    ),
}


@pytest.mark.parametrize("name", PIPELINES)
def test_functional_pipeline_pickles(name: str, small_shards: Shards) -> None:
    build = PIPELINES[name]
    restored = round_trip(build(wdsx, small_shards.urls))
    assert comparable(list(restored)) == comparable(list(build(webdataset, small_shards.urls)))


FLUENT: dict[str, Callable[[Any], Any]] = {
    "batched": lambda ds: ds.decode().to_tuple("txt", "cls").batched(4),
    "unbatched": lambda ds: ds.decode().to_tuple("txt", "cls").batched(4).unbatched(),
    "listed": lambda ds: ds.decode().listed(3),
    "unlisted": lambda ds: ds.decode().listed(3).unlisted(),
    "log_keys": lambda ds: ds.log_keys(),
    "map": lambda ds: ds.decode().map(with_length_field),
    "decode": lambda ds: ds.decode("rgb8"),
    "map_dict": lambda ds: ds.decode().map_dict(cls=plus_one),
    "select": lambda ds: ds.decode().select(has_even_label),
    "to_tuple": lambda ds: ds.decode().to_tuple("txt", "cls"),
    "map_tuple": lambda ds: ds.decode().to_tuple("txt", "cls").map_tuple(shout, plus_one),
    "slice": lambda ds: ds.slice(2, 9, 3),
    "rename": lambda ds: ds.decode().rename(caption="txt"),
    "rename_keys": lambda ds: ds.rename_keys(caption="txt", label="cls"),
    "extract_keys": lambda ds: ds.decode().extract_keys("txt", "cls"),
    "xdecode": lambda ds: ds.xdecode(cls=read_label),
    "mcached": lambda ds: ds.decode().mcached(),
    "compose": lambda ds: ds.decode().compose(webdataset_or_wdsx(ds).associate(shard_of)),
    "with_epoch": lambda ds: ds.decode().with_epoch(7),
    "with_length": lambda ds: ds.decode().with_length(20),
    "repeat": lambda ds: ds.decode().repeat(2),
    "shuffle": lambda ds: ds.decode().shuffle(5),
}
SORTED = {"shuffle"}


def webdataset_or_wdsx(dataset: Any) -> ModuleType:
    """The library ``dataset`` comes from."""
    return wdsx if type(dataset).__module__.startswith("wdsx") else webdataset


@pytest.mark.parametrize("name", FLUENT)
def test_fluent_pipeline_pickles(name: str, small_shards: Shards) -> None:
    build = FLUENT[name]
    restored = round_trip(build(wdsx.WebDataset(small_shards.urls, shardshuffle=False)))
    ours = comparable(list(restored))
    theirs = comparable(list(build(webdataset.WebDataset(small_shards.urls, shardshuffle=False))))
    if name in SORTED:
        ours, theirs = sorted(ours, key=repr), sorted(theirs, key=repr)
    assert ours == theirs


def test_stages_without_an_oracle_pickle(small_shards: Shards, tmp_path: Any) -> None:
    """Random stages and wdsx's own ones: they pickle, with the same description."""
    dataset = wdsx.WebDataset(small_shards.urls, shardshuffle=False)
    pipelines = [
        dataset.rsample(0.5),
        dataset.decode_resized(32),
        dataset.lmdb_cached(str(tmp_path / "cache.lmdb")),
        wdsx.DataPipeline(wdsx.ResampledShards(small_shards.urls), wdsx.tarfile_to_samples()).with_epoch(5),
        wdsx.DataPipeline(
            wdsx.SimpleShardList(small_shards.urls), wdsx.resampled(3), wdsx.tarfile_to_samples()
        ),
        wdsx.DataPipeline(
            wdsx.SimpleShardList(small_shards.urls),
            wdsx.cached_tarfile_to_samples(cache_dir=str(tmp_path / "shards")),
        ),
    ]
    for pipeline in pipelines:
        assert round_trip(pipeline).fingerprint() == pipeline.fingerprint()


# --- spawned workers -----------------------------------------------------------------------


def spawn_pipeline(lib: ModuleType, urls: list[str]) -> Any:
    """The stages that once held closures, in one pipeline."""
    return (
        lib.WebDataset(urls, shardshuffle=False)
        .xdecode(cls=read_label)
        .compose(lib.associate(shard_of))
        .rename_keys(label="cls", text="txt", keep_unselected=True)
        .rename(caption="text")
        .map_dict(label=plus_one)
        .to_tuple("__key__", "label", "caption", "shard")
        .map_tuple(None, plus_one, shout, None)
        .map(as_dict)
        .extract_keys("__key__", "label", "caption", "shard")
    )


def spawned(loader: str, lib: ModuleType, urls: list[str]) -> list:
    make = lib.WebLoader if loader == "WebLoader" else torch.utils.data.DataLoader
    batches = make(spawn_pipeline(lib, urls), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    return [tuple(item) for item in batches]


@pytest.mark.slow
@pytest.mark.parametrize("loader", ["WebLoader", "DataLoader"])
def test_spawned_workers_give_webdatasets_samples(loader: str, small_shards: Shards) -> None:
    ours = spawned(loader, wdsx, small_shards.urls)
    theirs = spawned(loader, webdataset, small_shards.urls)
    assert len(ours) == sum(small_shards.counts)
    assert ours == theirs, "both deal shards to workers round-robin and take items in turn"
