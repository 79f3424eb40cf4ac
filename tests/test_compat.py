"""Code written for webdataset gives the same samples with ``import wdsx as wds``.

Each pipeline is written once as a function of the module ``wds`` and run with webdataset
1.0.2 and with wdsx on the same shards (written by webdataset's own TarWriter)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import PIL.Image
import pytest
import torch
import webdataset

import wdsx
from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.samples import POSITION

warnings.filterwarnings("ignore", message=".*shardshuffle.*")


def jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    PIL.Image.fromarray(rng.integers(0, 255, (16, 24, 3), dtype=np.uint8)).save(
        out, format="JPEG", quality=90
    )
    return out.getvalue()


@pytest.fixture(scope="module")
def urls(tmp_path_factory) -> list[str]:
    directory = tmp_path_factory.mktemp("compat")
    paths = []
    for shard in range(3):
        path = str(directory / f"mixed-{shard:04d}.tar")
        with webdataset.TarWriter(path) as writer:
            for i in range(10):
                n = shard * 10 + i
                sample = {"__key__": f"{shard}/{i:03d}", "cls": n % 4, "txt": f"text {n}", "json": {"n": n}}
                sample.update(npy=np.arange(n, n + 6, dtype=np.int16).reshape(2, 3), mp={"n": [n, n]})
                sample["pth"] = torch.full((2,), float(n))
                if n % 3:
                    sample["jpg"] = jpeg(n)
                else:
                    sample["png"] = np.full((16, 24, 3), n, dtype=np.uint8)
                writer.write(sample)
        paths.append(path)
    return paths


def plain(value):
    """Comparable form of a pipeline output."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if k not in (POSITION, EPOCH_SEED)}
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.tolist())
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.tolist())
    if isinstance(value, PIL.Image.Image):
        return ("image", value.mode, np.asarray(value).tolist())
    return value


PIPELINES = {
    "raw": lambda wds, urls: wds.WebDataset(urls, shardshuffle=False),
    "decode-tuple": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False).decode("rgb8").to_tuple("jpg;png", "cls")
    ),
    "pil-map-tuple-batched": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False)
        .decode("pil")
        .to_tuple("jpg;png", "json", "__key__")
        .map_tuple(lambda image: image.size, lambda j: j["n"])
        .batched(4)
    ),
    "torch-batched-partial": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False)
        .decode("torchrgb")
        .to_tuple("jpg;png", "cls")
        .batched(7, partial=False)
    ),
    "rename-map-dict-select": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False)
        .decode()
        .rename(label="cls", text="txt")
        .map_dict(label=lambda x: x * 10)
        .select(lambda s: s["label"] != 20)
        .map(lambda s: {"t": s["text"].upper(), "label": s["label"]})
    ),
    "slice-listed-unlisted": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("txt").slice(3, 25, 2).listed(4).unlisted()
    ),
    "batched-unbatched": lambda wds, urls: (
        wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("cls", "txt").batched(6).unbatched()
    ),
    "functional": lambda wds, urls: wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.split_by_worker,
        wds.tarfile_to_samples(),
        wds.decode("l8"),
        wds.to_tuple("jpg;png", "txt"),
        wds.batched(5),
    ),
    "functional-curried": lambda wds, urls: wds.DataPipeline(
        wds.SimpleShardList(urls),
        wds.tarfile_to_samples(),
        wds.map(lambda s: s["__key__"]),
        wds.select(lambda k: k.endswith("1")),
    ),
    "select-files-rename-files": lambda wds, urls: wds.WebDataset(
        urls,
        shardshuffle=False,
        select_files=lambda name: not name.endswith(".json"),
        rename_files=lambda name: name.replace(".txt", ".text"),
    ).decode(),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_same_samples_as_webdataset(name, urls):
    build = PIPELINES[name]
    expected = [plain(item) for item in build(webdataset, urls)]
    got = [plain(item) for item in build(wdsx, urls)]
    assert got == expected
    assert len(got) > 0


def test_webloader_without_workers_matches(urls):
    build = PIPELINES["torch-batched-partial"]
    expected = [
        plain(b) for b in webdataset.WebLoader(build(webdataset, urls), batch_size=None, num_workers=0)
    ]
    got = [plain(b) for b in wdsx.WebLoader(build(wdsx, urls), batch_size=None, num_workers=0)]
    assert got == expected


def test_webloader_with_workers_delivers_the_same_samples(urls):
    def run(wds):
        dataset = wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("__key__", "cls").batched(3)
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2).unbatched()
        return sorted(plain(item) for item in loader)

    assert run(wdsx) == run(webdataset)


def test_tarwriter_loop_code_runs(tmp_path, urls):
    """webdataset's README writing loop, reading back with webdataset."""
    path = str(tmp_path / "out.tar")
    with wdsx.TarWriter(path) as sink:
        for sample in wdsx.WebDataset(urls, shardshuffle=False):
            sink.write({k: v for k, v in sample.items() if not k.startswith("__") or k == "__key__"})
    expected = [
        plain({k: v for k, v in s.items() if k not in ("__url__", "__local_path__")})
        for s in webdataset.WebDataset(urls, shardshuffle=False)
    ]
    got = [
        plain({k: v for k, v in s.items() if k not in ("__url__", "__local_path__")})
        for s in webdataset.WebDataset(path, shardshuffle=False)
    ]
    assert got == expected


def test_handler_protocol(urls):
    def boom(sample):
        if sample["__key__"].endswith("3"):
            raise ValueError("boom")
        return sample

    for module in (webdataset, wdsx):
        kept = [
            s["__key__"]
            for s in module.WebDataset(urls, shardshuffle=False).map(boom, handler=module.ignore_and_continue)
        ]
        assert len(kept) == 27
        stopped = [
            s["__key__"]
            for s in module.WebDataset(urls, shardshuffle=False).map(boom, handler=module.ignore_and_stop)
        ]
        assert stopped == ["0/000", "0/001", "0/002"]


def test_small_helpers_behave_like_webdataset(urls):
    expected = [s["__key__"] for s in webdataset.tarfile_samples(iter([{"url": u} for u in urls]))]
    assert [s["__key__"] for s in wdsx.tarfile_samples(iter([{"url": u} for u in urls]))] == expected
    assert [item["url"] for item in wdsx.shardspec(urls[0])] == [urls[0]]
    assert list(wdsx.non_empty(iter([1, 2]))) == [1, 2]
    with pytest.raises(ValueError):
        list(wdsx.non_empty(iter([])))
    assert wdsx.warn_and_stop(ValueError("x")) is False and wdsx.warn_and_continue(ValueError("x")) is True
    batch = wdsx.collate_torch([(np.ones(2), 1), (np.zeros(2), 2)])
    assert isinstance(batch[0], torch.Tensor) and batch[1].tolist() == [1, 2]
