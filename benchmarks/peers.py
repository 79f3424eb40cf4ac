"""The loaders that ``make bench`` sets beside wdsx, each used as its documentation shows for
images: how it writes the benchmark's JPEGs in its own format (once), reads them raw, and loads
them decoded in batches, fresh or from its own checkpoint (:mod:`benchmarks.bench_peers`
measures them).

litdata, Mosaic and torchdata.nodes store the JPEG's bytes and decode them with the call that
wdsx's ``decode("rgb8")`` makes (simplejpeg to an RGB uint8 array), so that they are compared
with wdsx as loaders, not as decoders; webdataset's ``decode("rgb8")`` decodes with Pillow.
The peers' packages are imported only here, when used: ``make bench`` installs them, and
nothing else needs them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import multiprocessing
import os
import shutil
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from benchmarks import bound, data

BATCH = 64
WORKERS = 2


@dataclass(frozen=True)
class Images:
    """The benchmark's JPEGs: their tar shards, and a folder for the other formats."""

    urls: list[str]
    samples: int
    folder: str


def images(samples: int) -> Images:
    """``samples`` JPEGs in tar shards of 1,000 (the ``make bench`` shards for 20,000), at least
    one per worker (webdataset fails in a worker that has no shard)."""
    nshards = max(WORKERS, samples // 1000)
    name = "jpeg" if samples == 20_000 else f"jpeg-{samples}"
    urls = data.jpeg_shards(samples, nshards, name=name)
    return Images(urls, nshards * (samples // nshards), os.path.join(data.ROOT, "peers", name))


def decode(jpeg: bytes) -> Any:
    """The one decoder every loader runs: what ``decode("rgb8")`` runs on a JPEG."""
    return bound.simplejpeg_rgb(jpeg)


def raw_samples(urls: list[str]) -> Iterator[tuple[str, bytes, int]]:
    """Key, JPEG bytes and class of every sample of the tar shards (to write the other formats)."""
    import wdsx

    for sample in wdsx.WebDataset(urls, shardshuffle=False):
        yield sample["__key__"], sample["jpg"], int(sample["cls"])


def _write_once(folder: str, write: Callable[[str], None]) -> None:
    """Run ``write(folder)`` unless an earlier run finished it (a marker file says so)."""
    marker = os.path.join(folder, ".complete")
    if not os.path.exists(marker):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        write(folder)
        open(marker, "w").close()


class Peer:
    """One loader: its package, how it writes the images, reads them raw, and loads them decoded
    in batches with (or without) a checkpoint."""

    name = ""
    package = ""
    resumable = True
    """Whether the loader has a checkpoint to resume from (webdataset has none)."""

    def version(self) -> str:
        return importlib.metadata.version(self.package)

    def label(self) -> str:
        """The loader's name and version, as the tables show it."""
        return f"{self.name} {self.version()}"

    def check(self) -> None:
        """Raise if the loader cannot be used here (not installed, fails to import)."""

    def prepare(self, images: Images) -> None:
        """Write the images in this loader's format (once)."""

    def raw(self, images: Images) -> Iterable[Any] | None:
        """The samples, not decoded, in this process; None where another loader reads alike."""
        raise NotImplementedError

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        """The decode loader, resumed from ``state`` when given."""
        raise NotImplementedError

    def checkpoint(self, loader: Any) -> Any:
        """The loader's state after the batches taken so far."""
        return loader.state_dict()


class Wdsx(Peer):
    name = package = "wdsx"
    worker_type = "process"

    def raw(self, images: Images) -> Iterable[Any] | None:
        import wdsx

        return wdsx.WebDataset(images.urls, shardshuffle=False)

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        import wdsx

        dataset = wdsx.WebDataset(images.urls, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls")
        loader = wdsx.WebLoader(
            dataset.batched(BATCH), batch_size=None, num_workers=WORKERS, worker_type=self.worker_type
        )
        if state is not None:
            loader.load_state_dict(state)
        return loader


class WdsxThreads(Wdsx):
    """wdsx with thread workers, as torchdata.nodes decodes: every worker a thread of this process."""

    name = "wdsx threads"
    worker_type = "thread"

    def label(self) -> str:
        return f"wdsx {self.version()} ({WORKERS} thread workers)"

    def raw(self, images: Images) -> Iterable[Any] | None:
        return None


class Webdataset(Peer):
    name = package = "webdataset"
    resumable = False

    def raw(self, images: Images) -> Iterable[Any]:
        import webdataset

        return webdataset.WebDataset(images.urls, shardshuffle=False)

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        import webdataset

        dataset = webdataset.WebDataset(images.urls, shardshuffle=False).decode("rgb8")
        batches = dataset.to_tuple("jpg", "cls").batched(BATCH)
        return webdataset.WebLoader(batches, batch_size=None, num_workers=WORKERS)


def _litdata_sample(sample: dict) -> tuple[Any, int]:
    """litdata's ``transform``: a stored sample to the decoded image and its class."""
    return decode(sample["jpg"]), sample["cls"]


def _litdata_shard(url: str) -> Iterator[dict]:
    """litdata's ``optimize`` function: the samples of one tar shard."""
    for _, jpeg, label in raw_samples([url]):
        yield {"jpg": jpeg, "cls": label}


class Litdata(Peer):
    """litdata's recipe: ``optimize`` into chunks, a ``StreamingDataset`` with a ``transform``,
    its ``StreamingDataLoader`` (whose ``state_dict`` is the checkpoint)."""

    name = package = "litdata"

    def check(self) -> None:
        import litdata  # noqa: F401

    def _folder(self, images: Images) -> str:
        return os.path.join(images.folder, "litdata")

    def prepare(self, images: Images) -> None:
        import litdata

        def write(folder: str) -> None:
            start_method = multiprocessing.get_start_method(allow_none=True)
            litdata.optimize(
                fn=_litdata_shard,
                inputs=images.urls,
                output_dir=folder,
                chunk_bytes="64MB",
                num_workers=1,
                verbose=False,
            )
            # optimize() sets the start method of the whole process (to "spawn"): the loaders
            # measured after it would start their workers that way
            multiprocessing.set_start_method(start_method, force=True)

        _write_once(self._folder(images), write)

    def raw(self, images: Images) -> Iterable[Any]:
        import litdata

        return litdata.StreamingDataset(self._folder(images))

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        import litdata

        dataset = litdata.StreamingDataset(self._folder(images), transform=_litdata_sample)
        loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
        if state is not None:
            loader.load_state_dict(state)
        return loader


@functools.cache
def mosaic_modules() -> tuple[Any, Any]:
    """Mosaic Streaming's ``StreamingDataset`` and ``MDSWriter``. The package's ``__init__``
    imports its torchvision datasets and its ``StreamingDataLoader``, which imports transformers;
    where those are not installed (this benchmark installs neither), its core modules are
    imported without running the two ``__init__`` files that pull them in."""
    if not importlib.util.find_spec("torchvision") or not importlib.util.find_spec("transformers"):
        spec = importlib.util.find_spec("streaming")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("No module named 'streaming' (mosaicml-streaming)")
        root = list(spec.submodule_search_locations)[0]
        for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
                package.__spec__.submodule_search_locations = package.__path__ = [path]
                sys.modules[name] = package
    dataset = importlib.import_module("streaming.base.dataset")
    writer = importlib.import_module("streaming.base.format.mds.writer")
    return dataset.StreamingDataset, writer.MDSWriter


@functools.cache
def _mosaic_images_class() -> type:
    """Mosaic's documented way to transform samples: a ``StreamingDataset`` subclass whose
    ``__getitem__`` does the work. Built on first use, since it subclasses a class of an optional
    package, and named as an attribute of this module (see ``__getattr__``) so that DataLoader
    workers started by spawn or forkserver can unpickle it."""
    streaming_dataset, _ = mosaic_modules()

    class MosaicImages(streaming_dataset):  # type: ignore[misc, valid-type]
        def __getitem__(self, index: int) -> tuple[Any, int]:
            sample = super().__getitem__(index)
            return decode(sample["jpg"]), sample["cls"]

    MosaicImages.__qualname__ = MosaicImages.__name__
    return MosaicImages


def __getattr__(name: str) -> Any:
    if name == "MosaicImages":
        return _mosaic_images_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MosaicLoader:
    """A plain DataLoader over a Mosaic dataset that counts the samples it hands out, which is
    all that Mosaic's ``StreamingDataLoader`` adds for a checkpoint on one rank (that class
    needs transformers)."""

    def __init__(self, dataset: Any) -> None:
        import torch.utils.data

        self.dataset = dataset
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=WORKERS)
        self.samples = 0

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            self.samples += len(batch[-1])
            yield batch

    def state_dict(self) -> dict:
        return self.dataset.state_dict(self.samples, False)


class Mosaic(Peer):
    """Mosaic Streaming: ``MDSWriter`` shards, read from a local folder (``local=``)."""

    name, package = "Mosaic Streaming", "mosaicml-streaming"

    def check(self) -> None:
        mosaic_modules()

    def _folder(self, images: Images) -> str:
        return os.path.join(images.folder, "mds")

    def prepare(self, images: Images) -> None:
        _, writer_class = mosaic_modules()

        def write(folder: str) -> None:
            with writer_class(out=folder, columns={"jpg": "bytes", "cls": "int"}) as writer:
                for _, jpeg, label in raw_samples(images.urls):
                    writer.write({"jpg": jpeg, "cls": label})

        _write_once(self._folder(images), write)

    def raw(self, images: Images) -> Iterable[Any]:
        streaming_dataset, _ = mosaic_modules()
        return streaming_dataset(local=self._folder(images), batch_size=BATCH)

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        dataset = _mosaic_images_class()(local=self._folder(images), batch_size=BATCH)
        if state is not None:
            dataset.load_state_dict(state)
        return MosaicLoader(dataset)


class JpegFiles:
    """A map-style dataset of JPEG files and their classes (one folder per class)."""

    def __init__(self, folder: str) -> None:
        classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
        self.items = [
            (os.path.join(folder, name, file), int(name))
            for name in classes
            for file in sorted(os.listdir(os.path.join(folder, name)))
        ]

    def __len__(self) -> int:
        return len(self.items)

    def read(self, index: int) -> tuple[bytes, int]:
        path, label = self.items[index]
        with open(path, "rb") as stream:
            return stream.read(), label

    def decoded(self, index: int) -> tuple[Any, int]:
        jpeg, label = self.read(index)
        return decode(jpeg), label


class TorchdataNodes(Peer):
    """torchdata.nodes: a sampler over the files, ``ParallelMapper`` reading and decoding on
    threads, ``Batcher`` and the default collate, in a ``Loader`` (whose ``state_dict`` is the
    checkpoint)."""

    name, package = "torchdata.nodes", "torchdata"

    def check(self) -> None:
        import torchdata.nodes  # noqa: F401

    def _folder(self, images: Images) -> str:
        return os.path.join(images.folder, "files")

    def prepare(self, images: Images) -> None:
        def write(folder: str) -> None:
            for key, jpeg, label in raw_samples(images.urls):
                os.makedirs(os.path.join(folder, str(label)), exist_ok=True)
                with open(os.path.join(folder, str(label), f"{key}.jpg"), "wb") as stream:
                    stream.write(jpeg)

        _write_once(self._folder(images), write)

    def _nodes(self, images: Images, work: Callable[[JpegFiles, int], Any], threads: int) -> Any:
        import torch.utils.data
        import torchdata.nodes as nodes

        files = JpegFiles(self._folder(images))
        indices = nodes.SamplerWrapper(torch.utils.data.SequentialSampler(range(len(files))))
        if threads:
            return nodes.ParallelMapper(indices, functools.partial(work, files), num_workers=threads)
        return nodes.Mapper(indices, functools.partial(work, files))

    def raw(self, images: Images) -> Iterable[Any]:
        import torchdata.nodes as nodes

        return nodes.Loader(self._nodes(images, JpegFiles.read, 0))

    def loader(self, images: Images, state: Any = None) -> Iterable[Any]:
        import torch.utils.data
        import torchdata.nodes as nodes

        batches = nodes.Batcher(self._nodes(images, JpegFiles.decoded, WORKERS), BATCH, drop_last=False)
        loader = nodes.Loader(nodes.Mapper(batches, torch.utils.data.default_collate))
        if state is not None:
            loader.load_state_dict(state)
        return loader


PEERS: tuple[Peer, ...] = (Wdsx(), WdsxThreads(), Webdataset(), Litdata(), Mosaic(), TorchdataNodes())
