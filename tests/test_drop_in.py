"""Differential drop-in corpus: programs written against webdataset's public API, as its users
write them, run once with webdataset 1.0.2 and once with wdsx, and compared.

Each program is data: Python source that imports ``webdataset`` (as a user would), reads the
shards named in ``DATA`` and leaves what it computed in ``result``. The runner executes it
as written (the oracle), then with its ``import``/``from`` lines pointed at ``wdsx`` instead;
nothing else changes. The outcomes (values, or the exception raised) must agree, except in
the cases marked ``differs``, where wdsx behaves differently on purpose: those assert the
difference itself, and say why. Cases marked ``known`` are differences being fixed elsewhere;
they are strict xfails, so they fail loudly once fixed and their marker must go.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import PIL.Image
import pytest
import torch
import webdataset

from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.samples import POSITION

MODULES = (
    "autodecode cache compat extradatasets filters gopen handlers mix pipeline pytorch "
    "shardlists tariterators tenbin utils writer"
).split()
"""webdataset 1.0.2's public modules: each appears in an import statement of the corpus."""


# --- the runner --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a program left in ``result``, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    def __repr__(self) -> str:
        return f"raised {self.error!r}" if self.error is not None else f"returned {self.value!r}"


def plain(value: Any) -> Any:
    """A comparable form of a program's result. Samples lose ``__position__`` and
    ``__epoch_seed__``: wdsx adds them on purpose (the position a checkpoint resumes from, and
    the seed of per-sample randomness)."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in (POSITION, EPOCH_SEED)}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, PIL.Image.Image):
        return ("image", value.mode, np.asarray(value).tolist())
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


_IMPORTS = re.compile(r"^(\s*(?:from|import)\s+)webdataset\b", re.M)


def for_wdsx(code: str) -> str:
    """The program with its imports of webdataset pointed at wdsx (and nothing else changed)."""
    return _IMPORTS.sub(r"\1wdsx", code)


def run_program(code: str, data: dict[str, Any]) -> Outcome:
    """Execute a corpus program with ``DATA`` set; the environment is restored afterwards."""
    environ = dict(os.environ)
    namespace: dict[str, Any] = {"__name__": "corpus_program", "DATA": data}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, "<corpus program>", "exec"), namespace)
        return Outcome(value=plain(namespace.get("result")))
    except Exception as exn:  # the outcome under test
        return Outcome(error=exn)
    finally:
        os.environ.clear()
        os.environ.update(environ)


def same_kind(web: BaseException, ours: BaseException) -> bool:
    """Whether ``ours`` is the same kind of exception as ``web``: an instance of each class
    webdataset's exception is an instance of, taking webdataset's own classes by name
    (``webdataset.autodecode.DecodingError`` and ``wdsx.DecodingError``)."""
    names = {cls.__name__ for cls in type(ours).__mro__}
    return all(
        cls.__name__ in names if cls.__module__.startswith("webdataset") else isinstance(ours, cls)
        for cls in type(web).__mro__
    )


def same(web: Outcome, ours: Outcome) -> None:
    """wdsx did what webdataset did: the same values, or the same kind of exception."""
    if web.error is not None:
        assert ours.error is not None and same_kind(web.error, ours.error), f"webdataset {web}, wdsx {ours}"
        return
    assert ours.error is None, f"webdataset {web}, wdsx {ours}"
    assert ours.value == web.value


@dataclass
class Case:
    """One corpus program. ``differs``: why wdsx differs on purpose, with ``check(web, ours)``
    asserting that difference. ``known``: a difference being fixed elsewhere (strict xfail);
    ``check`` then states the behaviour expected once it is fixed."""

    code: str
    differs: str | None = None
    known: str | None = None
    check: Callable[[Outcome, Outcome, dict[str, Any]], None] | None = None


def ok(outcome: Outcome) -> Any:
    assert outcome.error is None, outcome
    return outcome.value


Data = dict[str, Any]


def webdataset_cannot_build_it(web: Outcome, ours: Outcome, data: Data) -> None:
    """webdataset 1.0.2's class cannot be instantiated; wdsx's works."""
    assert isinstance(web.error, TypeError) and "abstract" in str(web.error)
    assert ok(ours)


def lmdb_replays_first_pass(web: Outcome, ours: Outcome, data: Data) -> None:
    first, replay = ok(web)
    assert len(first) == 8 and replay == [f"shard 1 sample {i}" for i in (3, 2, 1, 0)]
    assert ok(ours) == [first, first]


def draws_from_the_data(count: int) -> Callable[[Outcome, Outcome, Data], None]:
    def check(web: Outcome, ours: Outcome, data: Data) -> None:
        for outcome in (web, ours):
            assert len(ok(outcome)) == count and set(ok(outcome)) <= set(data["keys"])

    return check


def seeded_by_default(web: Outcome, ours: Outcome, data: Data) -> None:
    for run in ok(web) + ok(ours):
        assert sorted(run) == sorted(data["keys"])
    assert all(run == ok(ours)[0] for run in ok(ours))


def new_order_every_epoch(web: Outcome, ours: Outcome, data: Data) -> None:
    first = ok(web)[0]
    assert ok(web) == [first] * 3
    assert len({tuple(epoch) for epoch in ok(ours)}) == 3
    assert all(sorted(epoch) == sorted(first) for epoch in ok(ours))


def with_epoch_continues(web: Outcome, ours: Outcome, data: Data) -> None:
    keys = data["keys"]
    assert ok(web) == [keys[:5], keys[:5]] and ok(ours) == [keys[:5], keys[5:10]]


def repeat_repeats(web: Outcome, ours: Outcome, data: Data) -> None:
    assert ok(web) == len(data["keys"]) and ok(ours) == 60


def glob_select_files(web: Outcome, ours: Outcome, data: Data) -> None:
    assert isinstance(web.error, TypeError)
    assert ok(ours) == [["cls", "txt"]] * len(data["keys"])


def idle_workers_finish(web: Outcome, ours: Outcome, data: Data) -> None:
    assert isinstance(web.error, ValueError)
    assert ok(ours) == sorted(data["keys"])


def secure_when_decoding(web: Outcome, ours: Outcome, data: Data) -> None:
    assert ok(web) == [{"x": 1}] and isinstance(ours.error, ValueError)


def read_error(web: Outcome, ours: Outcome, data: Data) -> None:
    assert isinstance(web.error, tarfile.ReadError) and isinstance(ours.error, tarfile.ReadError)


def each_sample_once(web: Outcome, ours: Outcome, data: Data) -> None:
    assert ok(ours) == sorted(data["many_keys"])


# --- the corpus --------------------------------------------------------------------------

CASES: dict[str, Case] = {}


def case(name: str, code: str, **kw: Any) -> None:
    assert name not in CASES
    CASES[name] = Case(textwrap.dedent(code), **kw)


# Module imports: every public webdataset module, reached the ways users reach them.

case(
    "autodecode-decoder-with-handlers",
    """
    import webdataset as wds
    from webdataset import autodecode

    decoder = autodecode.Decoder(
        [autodecode.handle_extension("seg.png", lambda data: len(data)), autodecode.ImageHandler("l8")]
    )
    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).map(decoder)
    result = [(s["__key__"], s["seg.png"], s["cls"], s.get("jpg", s.get("png")).shape) for s in dataset]
    """,
)
case(
    "autodecode-basichandlers-imagehandler",
    """
    import webdataset as wds
    from webdataset.autodecode import basichandlers, imagehandler

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]),
        wds.tarfile_to_samples(),
        wds.decode(imagehandler("rgb8"), basichandlers),
        wds.to_tuple("jpg;png", "json", "npy"),
    )
    result = [(image.shape, meta["n"], array) for image, meta, array in dataset]
    """,
)
case(
    "autodecode-custom-handler-first",
    """
    import webdataset as wds

    def shout(key, data):
        if key.endswith(".txt"):
            return data.decode("utf-8").upper()
        return None

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).decode(shout, "pil").to_tuple("txt", "jpg;png")
    result = [(text, image.size, image.mode) for text, image in dataset]
    """,
)
case(
    "cache-pipe-cleaner-as-url-to-name",
    """
    import webdataset as wds
    from webdataset.cache import pipe_cleaner

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False, url_to_name=pipe_cleaner)
    result = [s["__key__"] for s in dataset]
    """,
)
case(
    "compat-fluid-wrapper",
    """
    from webdataset.compat import FluidWrapper, WebDataset

    source = [{"__key__": str(i), "n": i} for i in range(10)]
    wrapped = FluidWrapper(source).map(lambda s: s["n"] * 2).select(lambda n: n % 3).batched(3)
    result = [list(b) for b in wrapped], sum(1 for _ in WebDataset(DATA["urls"], shardshuffle=False))
    """,
)
case(
    "extradatasets-mock-dataset",
    """
    import webdataset as wds
    from webdataset.extradatasets import MockDataset

    sample = {"image": [[0.0] * 4] * 3, "label": 7}
    dataset = wds.DataPipeline(MockDataset(sample, 10), wds.to_tuple("image", "label"), wds.batched(4))
    result = [(images.shape, labels.tolist()) for images, labels in dataset]
    """,
)
case(
    "extradatasets-with-epoch-class",
    """
    import webdataset as wds
    from webdataset.extradatasets import with_epoch

    dataset = with_epoch(wds.WebDataset(DATA["urls"], shardshuffle=False), 5)
    result = [[s["__key__"] for s in dataset] for _ in range(2)]
    """,
    differs="webdataset 1.0.2's with_epoch class lacks __iter__ and cannot be instantiated",
    check=webdataset_cannot_build_it,
)
case(
    "extradatasets-with-length-class",
    """
    import webdataset as wds

    dataset = wds.with_length(wds.WebDataset(DATA["urls"], shardshuffle=False), 100)
    result = len(dataset), sum(1 for _ in dataset)
    """,
    differs="webdataset 1.0.2's with_length class lacks __iter__ and cannot be instantiated",
    check=webdataset_cannot_build_it,
)
case(
    "filters-functional-pipeline",
    """
    import webdataset.filters as filters

    batches = filters.pipeline(
        iter(range(20)),
        filters.map(lambda x: x * 2),
        filters.select(lambda x: x % 3),
        filters.batched(4),
    )
    result = [b.tolist() for b in batches]
    """,
)
case(
    "filters-pipelinefilter-custom-stage",
    """
    import webdataset as wds
    from webdataset.filters import pipelinefilter

    def _add_length(data, field):
        for sample in data:
            sample["length"] = len(sample[field])
            yield sample

    add_length = pipelinefilter(_add_length)
    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]),
        wds.tarfile_to_samples(),
        add_length("txt"),
        wds.to_tuple("__key__", "length"),
    )
    result = list(dataset)
    """,
)
case(
    "filters-mcached",
    """
    import webdataset as wds
    from webdataset.filters import Cached

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]), wds.tarfile_to_samples(), Cached(), wds.map(lambda s: s["__key__"])
    )
    fluent = wds.WebDataset(DATA["urls"], shardshuffle=False).mcached().map(lambda s: s["__key__"])
    result = [list(dataset), list(dataset), list(fluent), list(fluent)]
    """,
)
case(
    "filters-lmdb-cached",
    """
    import os
    import webdataset as wds

    # two shards whose samples share keys (keys need only be unique within a shard)
    for shard in range(2):
        with wds.TarWriter(os.path.join(DATA["out"], f"dup-{shard}.tar")) as sink:
            for i in range(4):
                sink.write({"__key__": f"{3 - i:04d}", "txt": f"shard {shard} sample {i}"})
    urls = [os.path.join(DATA["out"], f"dup-{shard}.tar") for shard in range(2)]
    dataset = wds.WebDataset(urls, shardshuffle=False).lmdb_cached(os.path.join(DATA["out"], "db")).decode()
    result = [[s["txt"] for s in dataset] for _ in range(2)]
    """,
    differs=(
        "webdataset stores LMDB items under __key__: the replay comes back sorted by key and keeps one "
        "sample per key; wdsx replays every sample in its first-pass order"
    ),
    check=lmdb_replays_first_pass,
)
case(
    "gopen-module-and-function",
    """
    import hashlib
    import webdataset as wds
    from webdataset.gopen import gopen

    with gopen(DATA["urls"][0]) as stream:
        first = hashlib.sha256(stream.read()).hexdigest()
    with wds.gopen(DATA["urls"][1], "rb") as stream:
        second = len(stream.read())
    result = first, second
    """,
)
case(
    "gopen-schemes-table",
    """
    from webdataset.gopen import gopen_schemes

    gopen_schemes["mine"] = lambda url, mode="rb", bufsize=8192: open(url[len("mine:"):], mode)
    result = sorted(gopen_schemes)[:3]
    del gopen_schemes["mine"]
    """,
)
case(
    "handlers-module",
    """
    import webdataset as wds
    from webdataset.handlers import ignore_and_stop, warn_and_continue

    def fussy(sample):
        if sample["__key__"].endswith("3"):
            raise ValueError("bad sample")
        return sample["__key__"]

    kept = list(wds.WebDataset(DATA["urls"], shardshuffle=False).map(fussy, handler=warn_and_continue))
    stopped = list(wds.WebDataset(DATA["urls"], shardshuffle=False).map(fussy, handler=ignore_and_stop))
    result = kept, stopped
    """,
)
case(
    "mix-random-mix",
    """
    import webdataset as wds
    from webdataset.mix import RandomMix, RoundRobin

    first = wds.DataPipeline(lambda: iter(range(5)))
    second = wds.DataPipeline(lambda: iter(range(100, 103)))
    result = list(RoundRobin([first, second])), sorted(RandomMix([first, second], longest=True))
    """,
)
case(
    "pipeline-module",
    """
    import webdataset as wds
    from webdataset.pipeline import DataPipeline

    dataset = DataPipeline(
        wds.SimpleShardList(DATA["urls"]),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.decode("torchrgb"),
        wds.to_tuple("jpg;png", "cls"),
        wds.batched(5, partial=False),
    )
    result = [(images.shape, images.dtype, labels.tolist()) for images, labels in dataset]
    """,
)
case(
    "pytorch-module-iterable-dataset",
    """
    import webdataset as wds
    from webdataset.pytorch import DataLoader, IterableDataset

    class Numbers(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    pipeline = wds.DataPipeline(Numbers(), wds.map(lambda x: x * x))
    result = [b.tolist() for b in DataLoader(pipeline, batch_size=4)]
    """,
)
case(
    "shardlists-functional-splitters",
    """
    import webdataset as wds
    from webdataset.shardlists import SimpleShardList, split_by_node, split_by_worker

    dataset = wds.DataPipeline(
        SimpleShardList(DATA["pattern"]),
        split_by_node,
        split_by_worker,
        wds.tarfile_to_samples(),
        wds.map(lambda s: s["__key__"]),
    )
    result = list(dataset)
    """,
)
case(
    "shardlists-resampled",
    """
    import webdataset as wds
    from webdataset.shardlists import resampled

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]),
        resampled(5),
        wds.tarfile_to_samples(),
        wds.map(lambda s: s["__key__"]),
    )
    result = list(dataset)
    """,
    differs="wdsx draws from the pipeline's seed, so runs repeat and resume; webdataset uses /dev/random",
    check=draws_from_the_data(5 * 8),
)
case(
    "tariterators-custom-grouping",
    """
    import webdataset as wds
    from webdataset.tariterators import group_by_keys, tar_file_expander, url_opener

    def last_dot(fname):
        # group "a.seg.png" under key "a.seg" (webdataset's default splits at the first dot)
        stem, _, ext = fname.rpartition(".")
        return stem, ext

    def samples(src, handler=wds.reraise_exception):
        streams = url_opener(src, handler=handler)
        files = tar_file_expander(streams, handler=handler)
        return group_by_keys(files, keys=last_dot, handler=handler)

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]), samples, wds.map(lambda s: (s["__key__"], sorted(s)))
    )
    result = list(dataset)
    """,
)
case(
    "tariterators-module-helpers",
    """
    from webdataset import tariterators

    samples = tariterators.tarfile_samples(iter([{"url": url} for url in DATA["urls"]]))
    result = (
        [s["__key__"] for s in samples],
        tariterators.base_plus_ext("dir/name.seg.png"),
        tariterators.base_plus_ext("README"),
        tariterators.valid_sample({"__key__": "x"}),
        tariterators.valid_sample({"__bad__": True}),
    )
    """,
)
case(
    "tenbin-module-buffers",
    """
    import io
    import numpy as np
    from webdataset import tenbin

    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array([-1, 0, 1], dtype=np.int64)]
    buffer = bytes(tenbin.encode_buffer(arrays, infos=["image", "labels"]))
    stream = io.BytesIO()
    tenbin.write(stream, arrays)
    stream.seek(0)
    result = buffer, tenbin.decode_buffer(buffer, infos=True), tenbin.read(stream)
    """,
)
case(
    "tenbin-fields-written-and-decoded",
    """
    import os
    import numpy as np
    import webdataset as wds

    path = os.path.join(DATA["out"], "tensors.tar")
    with wds.TarWriter(path) as sink:
        for i in range(3):
            arrays = [np.full((2, i + 1), i, dtype=np.float16), np.arange(i, dtype=np.uint8)]
            sink.write({"__key__": f"{i:03d}", "ten": arrays})
    raw = [s["ten"] for s in wds.WebDataset(path, shardshuffle=False)]
    decoded = [s["ten"] for s in wds.WebDataset(path, shardshuffle=False).decode()]
    result = raw, decoded, [s["ten"] for s in wds.WebDataset(DATA["urls"][0], shardshuffle=False).decode()]
    """,
)
case(
    "utils-repeatedly",
    """
    import webdataset as wds
    from webdataset.utils import repeatedly

    loader = wds.WebDataset(DATA["urls"], shardshuffle=False).to_tuple("__key__", "cls").batched(5)
    result = (
        [list(keys) for keys, _ in repeatedly(loader, nepochs=2)],
        [list(keys) for keys, _ in repeatedly(loader, nbatches=7)],
        [list(keys) for keys, _ in wds.repeatedly(loader, nsamples=12)],
    )
    """,
)
case(
    "utils-module-helpers",
    """
    import os
    import webdataset.utils as utils

    pattern = os.path.join(os.path.dirname(DATA["urls"][0]), "data-00000{0,2}.tar")
    result = (
        utils.pytorch_worker_info(),
        utils.pytorch_worker_seed(),
        [os.path.basename(p) for p in sorted(utils.glob_with_braces(pattern))],
        utils.fnmatch_with_braces("a.jpg", "*.{png,jpg}"),
        utils.is_iterable([1]),
        utils.is_iterable("abc"),
        utils.identity(3),
        utils.make_seed(1, 2, 3),
    )
    """,
)
case(
    "utils-pipeline-stage-subclass",
    """
    import webdataset as wds
    from webdataset.utils import PipelineStage

    class EveryOther(PipelineStage):
        def run(self, src):
            for i, sample in enumerate(src):
                if i % 2 == 0:
                    yield sample

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["urls"]),
        wds.tarfile_to_samples(),
        EveryOther(),
        wds.map(lambda s: s["__key__"]),
    )
    result = list(dataset)
    """,
)
case(
    "writer-shardwriter",
    """
    import glob
    import os
    import webdataset as wds
    from webdataset.writer import ShardWriter

    pattern = os.path.join(DATA["out"], "out-%06d.tar")
    with ShardWriter(pattern, maxcount=7) as sink:
        for sample in wds.WebDataset(DATA["urls"], shardshuffle=False):
            sink.write({"__key__": sample["__key__"], "cls": sample["cls"], "txt": sample["txt"]})
    shards = sorted(glob.glob(os.path.join(DATA["out"], "out-*.tar")))
    result = [[s["__key__"] for s in wds.WebDataset(url, shardshuffle=False)] for url in shards]
    """,
)
case(
    "writer-custom-handlers",
    """
    import os
    import webdataset as wds
    from webdataset import writer

    handlers = writer.make_handlers()
    writer.add_handlers(handlers, "words", lambda words: " ".join(words).upper().encode("utf-8"))
    path = os.path.join(DATA["out"], "custom.tar")
    with writer.TarWriter(path, encoder=handlers) as sink:
        sink.write({"__key__": "a", "words": ["hello", "there"], "cls": 3, "json": {"x": [1, 2]}})
    samples = wds.WebDataset(path, shardshuffle=False)
    result = [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")} for s in samples]
    """,
)
case(
    "writer-encoders",
    """
    import numpy as np
    import webdataset as wds
    from webdataset import writer

    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    result = (
        wds.numpy_dumps(array),
        bytes(writer.tenbin_dumps(array)),
        writer.bytestr(42),
        np.load(__import__("io").BytesIO(writer.numpy_npz_dumps({"a": array})))["a"],
        __import__("torch").load(__import__("io").BytesIO(wds.torch_dumps({"t": 1}))),
    )
    """,
)

# Fluent and functional pipelines.

case(
    "fluent-decode-tuple-batched",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["pattern"], shardshuffle=False)
    dataset = dataset.decode("rgb8").to_tuple("jpg;png", "cls").batched(6)
    result = [(images.shape, images.dtype, labels.tolist()) for images, labels in dataset]
    """,
)
case(
    "fluent-dict-batches",
    """
    import webdataset as wds

    dataset = (
        wds.WebDataset(DATA["urls"], shardshuffle=False)
        .decode()
        .map(lambda s: {"n": s["json"]["n"], "npy": s["npy"]})
        .batched(5)
    )
    result = [(b["n"].tolist(), b["npy"].shape) for b in dataset]
    """,
)
case(
    "fluent-torch-collation",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False)
    dataset = dataset.decode("torchrgb8").to_tuple("jpg;png", "cls").batched(4)
    result = [(images.shape, images.dtype, labels.tolist()) for images, labels in dataset]
    """,
)
case(
    "fluent-rename-map-dict-select",
    """
    import webdataset as wds

    dataset = (
        wds.WebDataset(DATA["urls"], shardshuffle=False)
        .decode()
        .rename(label="cls", text="txt", keep=False)
        .map_dict(label=lambda x: x + 100)
        .select(lambda s: s["label"] % 2 == 0)
    )
    result = [sorted(s.items()) for s in dataset]
    """,
)
case(
    "fluent-rename-keys-extract-keys",
    """
    import webdataset as wds

    renamed = wds.WebDataset(DATA["urls"], shardshuffle=False).rename_keys(image="*.jpg", label="cls")
    extracted = wds.WebDataset(DATA["urls"], shardshuffle=False).extract_keys("*.cls", "*.json")
    result = [sorted(s) for s in renamed][:4], list(extracted)[:4]
    """,
)
case(
    "fluent-map-tuple-slice-listed",
    """
    import webdataset as wds

    dataset = (
        wds.WebDataset(DATA["urls"], shardshuffle=False)
        .decode("pil")
        .to_tuple("jpg;png", "json")
        .map_tuple(lambda image: image.size, lambda meta: meta["n"])
        .slice(2, 20, 3)
        .listed(2)
    )
    result = list(dataset)
    """,
)
case(
    "fluent-batched-unbatched",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).decode().to_tuple("cls", "txt")
    dataset = dataset.batched(5).unbatched()
    result = list(dataset)
    """,
)
case(
    "fluent-xdecode",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).xdecode(
        ("*.txt", lambda stream: stream.read().decode("utf-8")),
        cls=lambda stream: int(stream.read()),
        must_decode=False,
    )
    result = [(s["txt"], s["cls"]) for s in dataset]
    """,
)
case(
    "fluent-decode-only-and-partial",
    """
    import webdataset as wds

    only = wds.WebDataset(DATA["urls"], shardshuffle=False).decode("l8", only=["png"])
    partial = wds.WebDataset(DATA["urls"], shardshuffle=False).map_dict(cls=int).decode(partial=True)
    result = [type(s.get("jpg", s.get("png"))).__name__ for s in only], [s["cls"] for s in partial]
    """,
)
case(
    "fluent-gz-fields",
    """
    import os
    import webdataset as wds

    path = os.path.join(DATA["out"], "gz.tar")
    with wds.TarWriter(path) as sink:
        for i in range(4):
            sink.write({"__key__": f"{i}", "txt.gz": "text " * i, "json.gz": {"i": i}})
    result = [(s["txt"], s["json"]) for s in wds.WebDataset(path, shardshuffle=False).decode()]
    """,
)
case(
    "fluent-select-files-rename-files",
    """
    import webdataset as wds

    dataset = wds.WebDataset(
        DATA["urls"],
        shardshuffle=False,
        select_files=lambda name: not name.endswith((".json", ".npy")),
        rename_files=lambda name: name.replace(".txt", ".text"),
    ).decode()
    result = [sorted(field for field in s if not field.startswith("__")) for s in dataset]
    """,
)
case(
    "fluent-context-manager",
    """
    import webdataset as wds

    with wds.WebDataset(DATA["urls"], shardshuffle=False) as dataset:
        result = [s["__key__"] for s in dataset.decode()]
    """,
)
case(
    "fluent-with-length",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).with_length(1000)
    result = len(dataset), sum(1 for _ in dataset)
    """,
)
case(
    "fluent-compressed-shard",
    """
    import webdataset as wds

    result = [(s["__key__"], s["txt"]) for s in wds.WebDataset(DATA["tgz"], shardshuffle=False).decode()]
    """,
)
case(
    "fluent-handler-skips-bad-json",
    """
    import os
    import webdataset as wds

    path = os.path.join(DATA["out"], "bad-json.tar")
    with wds.TarWriter(path) as sink:
        for i in range(5):
            sink.write({"__key__": f"{i}", "json": b"{" if i == 2 else b'{"i": %d}' % i})
    lenient = wds.WebDataset(path, shardshuffle=False).decode(handler=wds.ignore_and_continue)
    skipped = [s["json"] for s in lenient]
    result = skipped, [s["json"] for s in wds.WebDataset(path, shardshuffle=False).decode()]
    """,
)
case(
    "fluent-to-tuple-missing-field",
    """
    import webdataset as wds

    result = list(wds.WebDataset(DATA["urls"], shardshuffle=False).to_tuple("nope"))
    """,
)
case(
    "webloader-without-workers",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False)
    dataset = dataset.decode("torchrgb").to_tuple("jpg;png", "cls").batched(4)
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=0).unbatched().batched(6)
    result = [(images.shape, labels.tolist()) for images, labels in loader]
    """,
)
case(
    "dataloader-two-workers",
    """
    import torch
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).decode().to_tuple("__key__", "cls").batched(4)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    result = sorted(key for keys, _ in loader for key in keys)
    """,
)
case(
    "dataloader-mock-dataset",
    """
    import torch
    import webdataset as wds

    dataset = wds.MockDataset((torch.zeros(3, 8, 8), 1), 10)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2)
    result = [(images.shape, labels.tolist()) for images, labels in loader]
    """,
)

case(
    "with-epoch-after-a-full-pass",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False)
    everything = [s["__key__"] for s in dataset]
    dataset = dataset.with_epoch(6)
    result = len(everything), [s["__key__"] for s in dataset]
    """,
)

case(
    "with-epoch-restarts-a-pipeline-with-a-stage-of-its-own",
    """
    import webdataset as wds

    class EveryOther(wds.PipelineStage):
        def run(self, src):
            for index, sample in enumerate(src):
                if index % 2 == 0:
                    yield sample

    stages = wds.SimpleShardList(DATA["urls"]), wds.tarfile_to_samples(), EveryOther()
    dataset = wds.DataPipeline(*stages).with_epoch(3)
    result = [[s["__key__"] for s in dataset] for _ in range(2)]
    """,
)

# Deliberate differences.

case(
    "shardshuffle-seeded-by-default",
    """
    import webdataset as wds

    def keys():
        return [s["__key__"] for s in wds.WebDataset(DATA["urls"], shardshuffle=100)]

    result = [keys() for _ in range(4)]
    """,
    differs=(
        "wdsx's seed defaults to WDS_SEED or 0, so every rank and restart shuffles alike; "
        "webdataset picks a random seed per dataset"
    ),
    check=seeded_by_default,
)
case(
    "shard-order-changes-every-epoch",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"] * 4, shardshuffle=100)
    result = [[s["__key__"] for s in dataset] for _ in range(3)]
    """,
    differs=(
        "without a seed, webdataset picks a random one and repeats its shard order every epoch; "
        "wdsx draws a new order from its seed and the epoch"
    ),
    check=new_order_every_epoch,
)
case(
    "shard-order-seeded",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"] * 4, shardshuffle=5, seed=7)
    detshuffled = wds.WebDataset(DATA["urls"] * 4, shardshuffle=5, seed=7, detshuffle=True)
    listed = wds.DataPipeline(wds.SimpleShardList(DATA["urls"] * 4, seed=7), wds.tarfile_to_samples())
    resampled = wds.DataPipeline(
        wds.ResampledShards(DATA["urls"], nshards=6, seed=7, deterministic=True), wds.tarfile_to_samples()
    )
    each = (dataset, detshuffled, listed, resampled)
    result = [[[s["__key__"] for s in pipeline] for _ in range(2)] for pipeline in each]
    """,
)
case(
    "subclass-overrides-create-url-iterator",
    """
    import torch
    import webdataset as wds
    from webdataset import shardlists, utils

    class Shards(wds.WebDataset):
        def __init__(self, urls, listed):
            self.listed = listed
            super().__init__(urls, shardshuffle=2, detshuffle=True, seed=4, nodesplitter=wds.split_by_node)
            self.append(wds.filters.map(lambda s: s["__key__"]))

        def update_cache_info(self, args):
            super().update_cache_info(args)
            self.cache_seen = args.cache_dir

        def create_url_iterator(self, args):
            if self.listed and utils.is_iterable(args.urls):
                self.append(shardlists.SimpleShardList(args.urls, seed=11))
            else:
                super().create_url_iterator(args)

    own, plain = Shards(DATA["urls"] * 2, True), Shards(DATA["urls"], False)
    result = [[list(own) for _ in range(2)], list(plain), own.cache_seen]
    result.append(list(torch.utils.data.DataLoader(own, batch_size=None, num_workers=2)))
    """,
)
case(
    "subclass-overrides-iterator1",
    """
    import webdataset as wds

    class Tagged(wds.DataPipeline):
        def iterator1(self):
            for key in super().iterator1():
                yield "tagged " + key

    class Doubled(wds.DataPipeline):
        def iterator(self):
            for key in super().iterator():
                yield key
                yield key

    def stages():
        return wds.SimpleShardList(DATA["urls"]), wds.tarfile_to_samples(), wds.map(lambda s: s["__key__"])

    class Upper(wds.PipelineStage):
        def run(self, src):
            return (key.upper() for key in src)

    plain = wds.DataPipeline(*stages()).repeat(2)
    result = [list(Tagged(*stages()).repeat(2)), list(Doubled(*stages()))[:6]]
    result.append(list(Tagged(*stages()).with_epoch(3)))
    result += [list(plain.iterator1()), list(plain.iterator()), list(plain.invoke(Upper(), iter(["a", "b"])))]
    result += [list(plain.invoke(wds.map(str.upper), iter(["c"]))), list(plain.invoke(["d"]))]
    """,
)
case(
    "shuffle-buffer-seeded",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).shuffle(10, seed=3).map(lambda s: s["__key__"])
    result = list(dataset)
    """,
)
case(
    "with-epoch-continues",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).with_epoch(5)
    result = [[s["__key__"] for s in dataset] for _ in range(2)]
    """,
    differs="wdsx's with_epoch continues the stream across iter() calls; webdataset restarts it",
    check=with_epoch_continues,
)
case(
    "repeat-true-repeats",
    """
    import itertools
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False, repeat=True)
    result = len(list(itertools.islice(dataset, 60)))
    """,
    differs="WebDataset(repeat=True) repeats in wdsx; webdataset 1.0.2 ignores the argument",
    check=repeat_repeats,
)
case(
    "select-files-glob-string",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False, select_files="*.cls;*.txt")
    result = [sorted(field for field in s if not field.startswith("__")) for s in dataset]
    """,
    differs="wdsx accepts a glob string for select_files (webdataset calls it and fails)",
    check=glob_select_files,
)
case(
    "more-workers-than-shards",
    """
    import torch
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], shardshuffle=False).map(lambda s: s["__key__"])
    batches = iter(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=4))
    try:
        result = sorted(batches)
    finally:  # when a worker raises, stop the others now, not when the garbage is collected
        batches._shutdown_workers()
    """,
    differs="with fewer shards than workers, idle wdsx workers finish; webdataset raises 'No samples found'",
    check=idle_workers_finish,
)
case(
    "secure-mode-read-when-decoding",
    """
    import os
    import pickle
    import webdataset as wds

    path = os.path.join(DATA["out"], "pickles.tar")
    with wds.TarWriter(path) as sink:
        sink.write({"__key__": "a", "pyd": pickle.dumps({"x": 1})})
    os.environ["WDS_SECURE"] = "1"
    result = [s["pyd"] for s in wds.WebDataset(path, shardshuffle=False).decode()]
    """,
    differs=(
        "wdsx checks WDS_SECURE whenever it would unpickle; webdataset reads it once, when imported, "
        "so setting it later leaves unpickling on"
    ),
    check=secure_when_decoding,
)
case(
    "resampled-webdataset",
    """
    import itertools
    import webdataset as wds

    dataset = wds.WebDataset(DATA["urls"], resampled=True, shardshuffle=False)
    result = [s["__key__"] for s in itertools.islice(dataset, 30)]
    """,
    differs="wdsx resamples deterministically from the seed; webdataset from the time and process id",
    check=draws_from_the_data(30),
)

case(
    "shuffled-shards-split-by-worker",
    """
    import torch
    import webdataset as wds

    dataset = wds.DataPipeline(
        wds.SimpleShardList(DATA["many"]),
        wds.shuffle(100),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.map(lambda s: s["__key__"]),
    )
    result = sorted(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2))
    """,
    differs=(
        "webdataset's workers each shuffle the shard list with their own random order, so after "
        "split_by_worker samples repeat or go missing; wdsx's shuffle is seeded alike in every worker, "
        "so each sample comes exactly once"
    ),
    check=each_sample_once,
)

# A truncated .tgz: an error that is also a tarfile.ReadError, and ignore_and_stop keeps the
# samples before the damage.

case(
    "truncated-tgz-raises-read-error",
    """
    import webdataset as wds

    result = [s["__key__"] for s in wds.WebDataset(DATA["truncated"], shardshuffle=False)]
    """,
    differs="wdsx's error is a wdsx.ShardError (a tarfile.ReadError too) naming shard and compressed offset",
    check=read_error,
)
case(
    "pipeline-list-edited-in-place",
    """
    import webdataset as wds


    def keys(source):
        for sample in source:
            yield sample["__key__"]


    class KeyStream(wds.DataPipeline):
        def __init__(self, urls):
            super().__init__()
            self.pipeline.extend([wds.SimpleShardList(urls), wds.split_by_worker, wds.tarfile_to_samples()])
            self.pipeline += [keys]


    edited = wds.DataPipeline(wds.SimpleShardList(DATA["many"]), wds.tarfile_to_samples())
    edited.pipeline.insert(1, wds.split_by_node)
    edited.pipeline[-1] = wds.tarfile_to_samples()
    edited.pipeline.append(keys)
    result = [list(KeyStream(DATA["urls"])), list(edited)]
    """,
)
case(
    "plus-chains-two-datasets",
    """
    import webdataset as wds

    first = wds.WebDataset(DATA["urls"][0], shardshuffle=False).to_tuple("__key__")
    shards = wds.SimpleShardList(DATA["many"])
    second = wds.DataPipeline(shards, wds.tarfile_to_samples(), wds.to_tuple("cls"))
    result = [item[0] for item in first + second]
    """,
)
case(
    "tarwriter-tarstream-reached-into",
    """
    import io
    import os
    import tarfile

    import webdataset as wds

    path = os.path.join(DATA["out"], "reached.tar")
    with wds.TarWriter(path) as sink:
        for i in range(3):
            sink.write({"__key__": f"k{i}", "txt": f"text {i}"})
            sink.tarstream.members = []  # what code does to keep tarfile's member list small
        payload = b'{"added": true}'
        info = tarfile.TarInfo("k2.extra.json")
        info.size = len(payload)
        sink.tarstream.addfile(info, io.BytesIO(payload))
    result = [
        (s["__key__"], s["txt"], s.get("extra.json")) for s in wds.WebDataset(path, shardshuffle=False)
    ]
    """,
)
case(
    "truncated-tgz-ignore-and-stop",
    """
    import webdataset as wds

    dataset = wds.WebDataset(DATA["truncated"], shardshuffle=False, handler=wds.ignore_and_stop)
    result = [s["__key__"] for s in dataset]
    """,
)


# --- data and tests ----------------------------------------------------------------------


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (12, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _write(path: str, samples: list[dict[str, Any]]) -> str:
    with webdataset.TarWriter(path) as sink:
        for sample in samples:
            sink.write(sample)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Data:
    """Shards written by webdataset's TarWriter: three of eight mixed samples, eight small
    ones, a compressed one and a truncated copy of it."""
    directory = tmp_path_factory.mktemp("drop-in")
    urls, keys = [], []
    for shard in range(3):
        samples = []
        for i in range(8):
            n = shard * 8 + i
            sample = {"__key__": f"{shard}/{i:03d}", "cls": n % 4, "txt": f"text {n}", "json": {"n": n}}
            sample["npy"] = np.arange(n, n + 6, dtype=np.int16).reshape(2, 3)
            sample["ten"] = [np.full((2, 2), n, dtype=np.float32)]
            sample["seg.png"] = np.full((4, 4), n, dtype=np.uint8)
            if n % 2:
                sample["jpg"] = _jpeg(n)
            else:
                sample["png"] = np.full((12, 16, 3), n * 5, dtype=np.uint8)
            samples.append(sample)
            keys.append(sample["__key__"])
        urls.append(_write(str(directory / f"data-{shard:06d}.tar"), samples))
    many, many_keys = [], []
    for shard in range(8):
        many_keys += [f"m{shard}/{i}" for i in range(3)]
        many.append(
            _write(str(directory / f"many-{shard}.tar"), [{"__key__": k, "cls": 0} for k in many_keys[-3:]])
        )
    noise = np.random.default_rng(0)
    tgz = _write(
        str(directory / "packed.tgz"),
        [{"__key__": f"{i:03d}", "txt": noise.integers(0, 2**63, 400).tobytes().hex()} for i in range(40)],
    )
    truncated = str(directory / "truncated.tgz")
    with open(tgz, "rb") as whole, open(truncated, "wb") as half:
        content = whole.read()
        half.write(content[: len(content) // 2])
    return {
        "urls": urls,
        "pattern": str(directory / "data-{000000..000002}.tar"),
        "keys": keys,
        "many": many,
        "many_keys": many_keys,
        "tgz": tgz,
        "truncated": truncated,
    }


def _params() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=case.known)) if case.known else name
        for name, case in CASES.items()
    ]


@pytest.mark.parametrize("name", _params())
def test_program_behaves_as_with_webdataset(name: str, data: Data, tmp_path) -> None:
    case = CASES[name]
    outputs = {lib: tmp_path / lib for lib in ("webdataset", "wdsx")}
    for folder in outputs.values():
        folder.mkdir()
    web = run_program(case.code, {**data, "out": str(outputs["webdataset"])})
    ours = run_program(for_wdsx(case.code), {**data, "out": str(outputs["wdsx"])})
    if case.check is None:
        same(web, ours)
    else:
        case.check(web, ours, data)


def test_every_difference_says_why() -> None:
    for name, case in CASES.items():
        if case.check is not None and case.known is None:
            assert case.differs, f"{name} has its own check but no reason for the difference"


def test_corpus_covers_every_webdataset_module() -> None:
    assert len(CASES) >= 40
    corpus = "\n".join(case.code for case in CASES.values())
    for module in MODULES:
        imported = (
            rf"^\s*(import webdataset\.{module}\b|from webdataset\.{module} import"
            rf"|from webdataset import .*\b{module}\b)"
        )
        assert re.search(imported, corpus, re.M), f"no corpus program imports webdataset.{module}"
