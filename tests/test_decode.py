"""Decoding against webdataset 1.0.2's decoder, and the simplejpeg path against Pillow."""

from __future__ import annotations

import gzip
import io
import json
import pickle

import msgpack
import numpy as np
import PIL.Image
import pytest
import torch
import webdataset.autodecode as wad

import wdsx
from wdsx.codecs.decode import IMAGE_SPECS
from wdsx.codecs.decode import simplejpeg as fast_jpeg


def image_bytes(
    mode: str = "RGB", size: tuple[int, int] = (37, 29), fmt: str = "JPEG", **save: object
) -> bytes:
    rng = np.random.default_rng(7)
    height, width = size[1], size[0]
    gradient = np.linspace(0, 255, width * height).reshape(height, width)
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4}[mode]
    array = np.stack(
        [(gradient + 40 * c + rng.integers(0, 30, (height, width))) % 256 for c in range(channels)], -1
    )
    image = PIL.Image.fromarray(
        array.astype(np.uint8).squeeze(-1) if channels == 1 else array.astype(np.uint8), mode
    )
    out = io.BytesIO()
    image.save(out, format=fmt, **save)
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def torch_bytes(value: object) -> bytes:
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


SAMPLE = {
    "__key__": "k",
    "__url__": "u",
    "jpg": image_bytes(),
    "png": image_bytes("RGBA", fmt="PNG"),
    "gray.png": image_bytes("L", fmt="PNG"),
    "cls": b"7",
    "txt": "héllo".encode(),
    "json": json.dumps({"a": [1, 2]}).encode(),
    "npy": npy(np.arange(12, dtype=np.float32).reshape(3, 4)),
    "mp": msgpack.packb({"x": 1}),
    "pyd": pickle.dumps({"p": 3}),
    "pth": torch_bytes({"w": torch.ones(2)}),
    "txt.gz": gzip.compress(b"zipped"),
    "unknown": b"raw",
}


def same(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, PIL.Image.Image):
        return (
            isinstance(b, PIL.Image.Image)
            and a.mode == b.mode
            and np.array_equal(np.asarray(a), np.asarray(b))
        )
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


@pytest.fixture
def trusted(monkeypatch):
    """Pickle allowed, as webdataset always allows it (wdsx refuses it by default: see
    tests/test_security.py)."""
    monkeypatch.setenv("WDSX_ALLOW_PICKLE", "1")


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
def test_every_image_spec_matches_webdataset(spec, trusted):
    ours = wdsx.Decoder([wdsx.ImageHandler(spec)])(dict(SAMPLE))
    theirs = wad.Decoder([wad.ImageHandler(spec)])(dict(SAMPLE))
    assert same(ours, theirs)


def test_default_decoder_matches_webdataset(trusted):
    assert same(wdsx.Decoder([])(dict(SAMPLE)), wad.Decoder([])(dict(SAMPLE)))


def test_only_and_partial_match_webdataset(trusted):
    sample = dict(SAMPLE, already=42)
    ours = wdsx.Decoder([], only=["cls", "json"], partial=True)(sample)
    theirs = wad.Decoder([], only=["cls", "json"], partial=True)(sample)
    assert same(ours, theirs)


def test_custom_and_extension_handlers_take_precedence():
    seen = []

    def spy(key: str, data: bytes) -> object:
        seen.append(key)
        return None

    decoder = wdsx.Decoder(
        [spy, wdsx.handle_extension("seg.png", lambda data: "segment"), wdsx.imagehandler("rgb8")]
    )
    result = decoder({"__key__": "k", "seg.png": SAMPLE["png"], "jpg": SAMPLE["jpg"], "cls": b"3"})
    assert result["seg.png"] == "segment" and result["jpg"].shape == (29, 37, 3) and result["cls"] == 3
    assert sorted(seen) == [".cls", ".jpg", ".seg.png"]


def test_decoding_error_names_shard_key_and_field():
    with pytest.raises(wdsx.DecodingError) as caught:
        wdsx.Decoder([wdsx.imagehandler("rgb8")])(
            {"__key__": "k9", "__url__": "s3://b/x.tar", "jpg": b"not a jpeg"}
        )
    assert caught.value.key == "k9" and caught.value.k == "jpg" and caught.value.url == "s3://b/x.tar"
    assert "k9" in str(caught.value) and "jpg" in str(caught.value) and "s3://b/x.tar" in str(caught.value)


JPEG_VARIANTS = {
    "444": {"subsampling": 0, "quality": 95},
    "422": {"subsampling": 1, "quality": 90},
    "420": {"subsampling": 2, "quality": 75},
    "progressive": {"progressive": True, "quality": 85},
    "low-quality": {"quality": 10},
}


@pytest.mark.parametrize("variant", sorted(JPEG_VARIANTS))
@pytest.mark.parametrize("size", [(37, 29), (64, 64), (1, 1), (255, 17)])
def test_simplejpeg_gives_pillows_arrays(variant, size):
    assert fast_jpeg is not None, "simplejpeg is a test dependency"
    data = image_bytes("RGB", size, **JPEG_VARIANTS[variant])
    handler = wdsx.ImageHandler("rgb8")
    fast = handler.decoder_for(".jpg")(data)
    assert handler.decoder_for(".jpg") == handler._decode_jpeg
    reference = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))
    assert fast.dtype == np.uint8 and np.array_equal(fast, reference)


@pytest.mark.parametrize("mode", ["L", "CMYK"])
def test_gray_and_cmyk_jpegs_match_pillow(mode):
    data = image_bytes(mode, (20, 30))
    result = wdsx.ImageHandler("rgb8")(".jpg", data)
    assert np.array_equal(result, np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB")))


@pytest.mark.parametrize("spec", ["pil", "rgb8"])
def test_bytes_pillow_cannot_identify_are_an_error_naming_the_field_not_a_buffer(tmp_path, spec):
    from tests.fixtures.shards import write_tar

    shard = write_tar(str(tmp_path / "bad.tar"), [("a.png", b"not a png at all"), ("a.cls", b"1")])
    with pytest.raises(wdsx.DecodingError) as raised:
        list(wdsx.WebDataset(shard, shardshuffle=False).decode(spec))
    message = str(raised.value)
    assert f"field 'png' of sample 'a' in shard {shard}" in message
    assert "not an image format Pillow recognises" in message and "BytesIO" not in message
    with pytest.raises(PIL.UnidentifiedImageError):  # Pillow's own verdict on the same bytes
        PIL.Image.open(io.BytesIO(b"not a png at all"))
    assert isinstance(raised.value.__cause__, PIL.UnidentifiedImageError)
