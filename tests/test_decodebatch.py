"""The stages a pipeline runs (:mod:`wdsx.stages.plan`): decoding after the shuffle and straight
into the batch gives, batch for batch, what the stages as written give, pixels as Pillow
decodes them, the errors they raise, and exact resumption.

Oracles: Pillow's decoder, and the same pipeline with the rewrite turned off (the stages run
one by one as written)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import PIL.Image
import pytest
import torch

import wdsx
import wdsx.pipeline.datapipeline as datapipeline
from tests.fixtures.shards import write_tar
from wdsx.stages import plan
from wdsx.stages.decodebatch import DecodeBatched


def jpeg(seed: int, size: tuple[int, int] = (40, 48), mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=80)
    return out.getvalue()


def pillow_rgb(data: bytes) -> np.ndarray:
    return np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Four shards of 25 JPEG samples (a few grayscale and CMYK ones among them, which take
    Pillow's path) and the JPEG of each key."""
    directory = tmp_path_factory.mktemp("images")
    urls, by_key = [], {}
    for shard in range(4):
        members = []
        for index in range(25):
            key = f"s{shard}/{index:03d}"
            mode = {7: "L", 13: "CMYK"}.get(index, "RGB")
            data = jpeg(shard * 100 + index, mode=mode)
            by_key[key] = data
            members += [(f"{key}.jpg", data), (f"{key}.cls", str(index % 10).encode())]
        urls.append(write_tar(os.path.join(directory, f"shard-{shard}.tar"), members))
    return urls, by_key


@pytest.fixture
def as_written(monkeypatch):
    """Runs pipelines with their stages one by one, as written."""

    def use(enabled: bool) -> None:
        written = lambda stages, threads: list(stages)
        monkeypatch.setattr(datapipeline, "execution_stages", written if enabled else plan.execution_stages)

    return use


def same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (np.ndarray, torch.Tensor)):
        return type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    return a == b


PIPELINES = {
    "shuffle, then decode": lambda urls, spec: (
        wdsx.WebDataset(urls, shardshuffle=True)
        .shuffle(30)
        .decode(spec)
        .to_tuple("jpg", "cls", "__key__")
        .batched(8)
    ),
    "decode, then shuffle": lambda urls, spec: (
        wdsx.WebDataset(urls, shardshuffle=True)
        .decode(spec)
        .rename(image="jpg")
        .to_tuple("image", "cls", "__key__")
        .shuffle(30)
        .batched(8)
    ),
    "dicts": lambda urls, spec: wdsx.WebDataset(urls).decode(spec).batched(8),
}


@pytest.mark.parametrize("name", PIPELINES)
@pytest.mark.parametrize("spec", ["rgb8", "torchrgb", "torchrgb8", "l8"])
def test_the_rewritten_pipeline_gives_the_batches_of_the_stages_as_written(images, as_written, name, spec):
    urls, _ = images
    build = PIPELINES[name]
    stages = plan.execution_stages(build(urls, spec).pipeline)
    assert len(stages) == len(build(urls, spec).pipeline)
    assert any(isinstance(stage, DecodeBatched) for stage in stages)
    rewritten = list(build(urls, spec))
    as_written(True)
    written = list(build(urls, spec))
    assert same(rewritten, written)


def test_images_are_decoded_as_pillow_decodes_them(images):
    urls, by_key = images
    for batch, _, keys in PIPELINES["shuffle, then decode"](urls, "rgb8"):
        assert isinstance(batch, np.ndarray) and batch.shape == (len(keys), 40, 48, 3)
        for image, key in zip(batch, keys):
            assert np.array_equal(image, pillow_rgb(by_key[key]))


def test_images_of_different_sizes_raise_what_batching_them_raises(tmp_path, as_written):
    members = [(f"k{i}.jpg", jpeg(i, size=(40, 48 + (i == 3)))) for i in range(6)]
    url = write_tar(str(tmp_path / "mixed.tar"), members)

    def build():
        return wdsx.WebDataset(url).decode("rgb8").to_tuple("jpg").batched(6)

    with pytest.raises(ValueError) as rewritten:
        list(build())
    as_written(True)
    with pytest.raises(ValueError) as written:
        list(build())
    assert str(rewritten.value) == str(written.value)


def test_a_broken_image_raises_a_decoding_error_naming_its_sample(tmp_path):
    members = [(f"k{i}.jpg", jpeg(i)) for i in range(5)] + [("k5.jpg", b"\xff\xd8 not a jpeg")]
    url = write_tar(str(tmp_path / "broken.tar"), members)
    with pytest.raises(wdsx.DecodingError, match="k5"):
        list(wdsx.WebDataset(url).shuffle(3).decode("rgb8").to_tuple("jpg").batched(4))


def test_user_handlers_and_skipping_handlers_are_left_as_written(images):
    urls, _ = images
    custom = wdsx.WebDataset(urls).decode(wdsx.handle_extension("jpg", pillow_rgb)).to_tuple("jpg").batched(4)
    skipping = wdsx.WebDataset(urls).decode("rgb8", handler=wdsx.warn_and_continue).shuffle(5).batched(4)
    for dataset in (custom, skipping):
        assert plan.execution_stages(dataset.pipeline) == dataset.pipeline


def keys_of(batches) -> list[list[str]]:
    return [list(batch[2]) for batch in batches]


@pytest.mark.parametrize("workers", [None, 2])
def test_a_resumed_run_continues_exactly(images, workers):
    urls, _ = images

    def build():
        dataset = PIPELINES["decode, then shuffle"](urls, "rgb8")
        return dataset if workers is None else wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)

    full = keys_of(build())
    first = build()
    batches = iter(first)
    before = keys_of(next(batches) for _ in range(3))
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = build()
    second.load_state_dict(state)
    assert before + keys_of(second) == full


def test_decoding_on_threads_gives_the_same_batches(images):
    urls, _ = images

    def build(threads: int):
        dataset = PIPELINES["decode, then shuffle"](urls, "rgb8")
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=1, decode_threads=threads)

    assert same(list(build(3)), list(build(1)))
