"""``wdsx index --sizes`` and ``WebDataset(..., index_sizes=True)``: sample measures recorded in
the offset index, checked against Pillow on members extracted with ``tarfile`` and against
``json.loads``; bucketing by them matches bucketing by a key computed from decoded images."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest
from PIL import Image

import wdsx
from tests.fixtures.records import make_npy_shards
from wdsx.commands.cli import main
from wdsx.core.errors import ShardError
from wdsx.read.index import ShardIndex, index_url, load_index, scan_index

FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}


def encoded(extension: str, width: int, height: int) -> bytes:
    """An image of that size, encoded in the format its extension names."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (width % 256, height % 256, 7)).save(buffer, FORMATS[extension])
    return buffer.getvalue()


def write_tar(path: str, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def image_shards(directory: str, shards: int = 3, per_shard: int = 8) -> list[str]:
    """Tar shards of samples with one image of varied size and format, some with a second
    image (``seg.png``), and a ``json`` member holding a token list."""
    urls = []
    for shard in range(shards):
        members = []
        for index in range(per_shard):
            number = shard * per_shard + index
            key = f"s{number:04d}"
            extension = ("jpg", "png", "webp")[number % 3]
            width, height = 8 + (number * 7) % 40, 8 + (number * 11) % 30
            members.append((f"{key}.{extension}", encoded(extension, width, height)))
            if number % 4 == 0:
                members.append((f"{key}.seg.png", encoded("png", height, width)))
            members.append((f"{key}.json", json.dumps({"tokens": list(range(number % 9))}).encode()))
        urls.append(write_tar(os.path.join(directory, f"img-{shard:02d}.tar"), members))
    return urls


def expected_sizes(urls: list[str]) -> dict[str, dict[str, int]]:
    """The oracle: every member extracted with tarfile, images measured by Pillow, token
    lists parsed with json.loads."""
    expected: dict[str, dict[str, int]] = {}
    for url in urls:
        with tarfile.open(url) as archive:
            for info in archive.getmembers():
                key, field = info.name.split(".", 1)
                data = archive.extractfile(info).read()  # type: ignore[union-attr]
                sizes = expected.setdefault(key, {})
                if field == "json":
                    sizes["json.tokens"] = len(json.loads(data)["tokens"])
                else:
                    sizes[f"{field}.width"], sizes[f"{field}.height"] = Image.open(io.BytesIO(data)).size
    return expected


def index(*args: str) -> None:
    assert main(["index", *args]) == 0


@pytest.fixture
def images(tmp_path):
    urls = image_shards(str(tmp_path))
    index("--sizes", "--tokens-field", "tokens", *urls)
    return urls


def test_image_and_token_sizes_match_pillow_and_json(images):
    dataset = wdsx.WebDataset(images, index_sizes=True, shardshuffle=False)
    found = {sample["__key__"]: sample["__sizes__"] for sample in dataset}
    assert found == expected_sizes(images)


def test_jsonl_token_counts_match_json_loads(tmp_path):
    path = tmp_path / "docs-0000.jsonl"
    values = [{"tokens": ["a"] * (n * 3 % 17), "id": n} if n % 5 else {"id": n} for n in range(40)]
    path.write_text("".join(json.dumps(value) + "\n" for value in values))
    index("--sizes", "--tokens-field", "tokens", str(path))
    samples = list(wdsx.WebDataset(str(path), index_sizes=True, shardshuffle=False))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    expected = [{"json.tokens": len(line["tokens"])} if "tokens" in line else {} for line in lines]
    assert [sample["__sizes__"] for sample in samples] == expected


def bucketed(urls: list[str], key, **reading):
    return (
        wdsx.WebDataset(urls, shardshuffle=True, seed=3, **reading)
        .shuffle(10)
        .bucket(key, boundaries=[0.6, 1.0, 1.6], batch_size=3, max_held=8, collation_fn=None)
    )


def aspect_from_index(sample):
    sizes = sample["__sizes__"]
    name = next(field for field in ("jpg", "png", "webp") if f"{field}.width" in sizes)
    return sizes[f"{name}.width"] / sizes[f"{name}.height"]


def aspect_from_pixels(sample):
    image = next(sample[field] for field in ("jpg", "png", "webp") if field in sample)
    return image.width / image.height


def test_bucketing_by_index_sizes_gives_the_batches_decoding_gives(images):
    by_index = bucketed(images, aspect_from_index, index_sizes=True)
    by_pixels = (
        wdsx.WebDataset(images, shardshuffle=True, seed=3)
        .shuffle(10)
        .decode("pil")
        .bucket(aspect_from_pixels, boundaries=[0.6, 1.0, 1.6], batch_size=3, max_held=8, collation_fn=None)
    )
    keys = [[item["__key__"] for item in batch] for batch in by_index]
    assert keys == [[item["__key__"] for item in batch] for batch in by_pixels]
    assert len({len(batch) for batch in keys}) > 1 and sum(map(len, keys)) == 24


def test_resume_is_exact_with_sizes_attached(images):
    def make_loader():
        dataset = bucketed(images, aspect_from_index, index_sizes=True).map(
            lambda batch: [(item["__key__"], item["__sizes__"]) for item in batch]
        )
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=0)

    report = wdsx.check_resume(make_loader, cuts=3, epochs=2)
    assert report.identical, str(report)


def test_sizes_survive_selecting_members(images):
    dataset = wdsx.WebDataset(images, index_sizes=True, shardshuffle=False, select_files="*.json")
    found = {sample["__key__"]: sample["__sizes__"] for sample in dataset}
    assert found == expected_sizes(images)


def test_an_index_without_sizes_still_loads_and_is_named_when_sizes_are_asked(tmp_path):
    urls = image_shards(str(tmp_path), shards=1)
    index(*urls)
    written = load_index(urls[0])
    assert written is not None and written.sizes is None
    assert np.array_equal(written.offsets, scan_index(urls[0]).offsets)
    assert "sizes" not in open(index_url(urls[0])).read()
    with pytest.raises(ShardError, match=r"img-00\.tar: its offset index has no sizes: .*wdsx index --sizes"):
        list(wdsx.WebDataset(urls, index_sizes=True))
    os.remove(index_url(urls[0]))
    with pytest.raises(ShardError, match=r"img-00\.tar: no offset index .*img-00\.tar\.idx"):
        list(wdsx.WebDataset(urls, index_sizes=True))


def test_an_index_with_sizes_keeps_its_offsets_and_round_trips(images):
    written = load_index(images[1])
    assert written is not None and written.sizes is not None
    assert np.array_equal(written.offsets, scan_index(images[1]).offsets)
    again = ShardIndex.from_json(written.to_json())
    assert again.sizes is not None and again.sizes.keys() == written.sizes.keys()
    assert all(np.array_equal(again.sizes[name], written.sizes[name]) for name in written.sizes)


def test_size_columns_cannot_claim_more_than_the_limit(images):
    record = json.loads(open(index_url(images[0])).read())
    record["sizes"] |= {f"extra{i}": record["sizes"]["jpg.width"] for i in range(10)}
    columns = len(record["sizes"])  # 9 measured (four image fields, the tokens) and 10 more
    with pytest.raises(ValueError, match=rf"a\.idx: its {columns} size columns of 8 samples exceed"):
        ShardIndex.from_json(json.dumps(record), "a.idx", limit=8 * 100)
    record["sizes"]["jpg.width"] = {"dtype": "<f4", "values": ""}
    with pytest.raises(ValueError, match=r"sizes 'jpg.width' of type '<f4', not integers"):
        ShardIndex.from_json(json.dumps(record), "a.idx")


def test_a_member_that_is_not_an_image_is_named(tmp_path, capsys):
    url = write_tar(str(tmp_path / "bad.tar"), [("a.png", encoded("png", 4, 4)), ("b.jpg", b"not a jpeg")])
    assert main(["index", "--sizes", url]) == 1
    assert "bad.tar: sample 'b', field 'jpg': not an image Pillow can measure" in capsys.readouterr().err
    assert not os.path.exists(index_url(url))


def test_tokens_field_needs_sizes(tmp_path, capsys):
    urls = image_shards(str(tmp_path), shards=1)
    assert main(["index", "--tokens-field", "tokens", *urls]) != 0
    assert "--tokens-field is measured with --sizes" in capsys.readouterr().err


def test_npy_shards_have_no_sizes(tmp_path):
    shards = make_npy_shards(str(tmp_path), [4])
    with pytest.raises(ShardError, match=r"feats-000\.npy: sizes come from an offset index"):
        list(wdsx.WebDataset(shards.urls, index_sizes=True))


def test_a_tokens_field_that_is_not_a_list_is_named(tmp_path, capsys):
    path = tmp_path / "docs-0000.jsonl"
    path.write_text('{"tokens": [1, 2]}\n{"tokens": "abc"}\n')
    assert main(["index", "--sizes", "--tokens-field", "tokens", str(path)]) == 1
    assert "sample 'docs-0000/1', field 'json': 'tokens' holds a str, not a list" in capsys.readouterr().err
