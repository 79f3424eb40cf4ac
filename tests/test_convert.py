"""``wdsx convert``: round trips read back by webdataset, wdsx and tarfile, determinism across worker
counts and ranks, resumption after a hard kill, and reporting of unreadable images."""

from __future__ import annotations

import hashlib
import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

import wdsx
from wdsx.commands.cli import main
from wdsx.core.topology import rank_and_world_from_environment as rank_and_world_size
from wdsx.read.manifest import Manifest
from wdsx.write.convert import ConvertSettings, convert

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "data" / "fashion-mnist-mini"


def _image_bytes(seed: int, size: tuple[int, int], image_format: str) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=image_format)
    return out.getvalue()


def _make_folder(root: Path, per_class: int = 6, classes=("cat", "dog", "emu"), size=(12, 9)) -> Path:
    formats = [("jpg", "JPEG"), ("png", "PNG"), ("JPEG", "JPEG"), ("webp", "WEBP")]
    for c, name in enumerate(classes):
        for i in range(per_class):
            ext, image_format = formats[(c + i) % len(formats)]
            path = root / name / f"img{i:03d}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_image_bytes(100 * c + i, size, image_format))
    return root


def _source_images(src: Path) -> dict[str, tuple[bytes, int]]:
    """Every image file under src: relative path -> (bytes, class index), by an independent walk."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = {}
    for label, name in enumerate(classes):
        for path in (src / name).rglob("*"):
            if path.is_file() and not path.name.startswith(".") and path.suffix.lower() != ".txt":
                found[str(path.relative_to(src))] = (path.read_bytes(), label)
    return found


def _shards(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tar"))


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _shards(directory)}


def _read_back(directory: Path, library: object = wds) -> list[dict]:
    urls = [str(p) for p in _shards(directory)]
    return list(library.WebDataset(urls, shardshuffle=False))


@pytest.mark.slow  # kept out of the fast loop (subprocesses)
@pytest.mark.parametrize("library", [wds, wdsx], ids=["webdataset", "wdsx"])
def test_round_trip_of_the_shipped_subset(tmp_path, library):
    assert main(["convert", str(MINI), str(tmp_path / "train"), "--maxcount", "600", "--quiet"]) == 0
    source = _source_images(MINI)
    assert len(source) == 2000
    samples = _read_back(tmp_path, library)
    assert len(samples) == len(source)
    by_bytes = {}
    for sample in samples:
        assert sample.keys() >= {"png", "cls"}
        by_bytes[sample["__key__"]] = (sample["png"], int(sample["cls"]))
    for relative, (data, label) in source.items():
        assert by_bytes[relative.rsplit(".", 1)[0]] == (data, label)
    with tarfile.open(_shards(tmp_path)[0]) as tar:
        first = tar.getmembers()[:2]
        assert [m.name for m in first] == ["Ankle_boot/00000.cls", "Ankle_boot/00000.png"]
        assert tar.extractfile(first[1]).read() == (MINI / "Ankle_boot" / "00000.png").read_bytes()
    manifest = Manifest.load(str(tmp_path / "train.manifest.json"))
    assert manifest.extra["classes"] == sorted(p.name for p in MINI.iterdir() if p.is_dir())
    assert [s.samples for s in manifest.shards] == [600, 600, 600, 200]


def test_keys_are_unique_and_dot_free(tmp_path):
    src = tmp_path / "src"
    data = {
        "a/x.v2.jpg": _image_bytes(1, (8, 8), "JPEG"),
        "a/same.jpg": _image_bytes(2, (8, 8), "JPEG"),
        "a/same.png": _image_bytes(3, (8, 8), "PNG"),
        "a/100%.png": _image_bytes(4, (8, 8), "PNG"),
        "a/nested.dir/deep.JPEG": _image_bytes(5, (8, 8), "JPEG"),
        "a/._x.v2.jpg": b"AppleDouble junk",
        "a/notes.txt": b"not an image",
        ".ipynb_checkpoints/z.png": _image_bytes(6, (8, 8), "PNG"),
        "b/y.png": _image_bytes(7, (8, 8), "PNG"),
    }
    for relative, content in data.items():
        (src / relative).parent.mkdir(parents=True, exist_ok=True)
        (src / relative).write_bytes(content)
    report = convert(str(src), str(tmp_path / "out") + "/", ConvertSettings())
    assert report.skipped == [] and report.samples == 6
    samples = _read_back(tmp_path / "out")
    keys = [s["__key__"] for s in samples]
    assert keys == ["a/100%25", "a/nested.dir/deep", "a/same%2Ejpg", "a/same%2Epng", "a/x%2Ev2", "b/y"]
    assert [s["cls"] for s in samples] == [b"0"] * 5 + [b"1"]
    fields = {s["__key__"]: s[next(k for k in s if k in ("jpg", "png"))] for s in samples}
    assert fields["a/nested.dir/deep"] == data["a/nested.dir/deep.JPEG"]
    assert fields["a/same%2Epng"] == data["a/same.png"]
    assert fields["a/x%2Ev2"] == data["a/x.v2.jpg"]
    assert "jpg" in samples[1]  # .JPEG is stored as jpg


def test_output_is_identical_for_any_number_of_workers(tmp_path):
    src = _make_folder(tmp_path / "src", per_class=10)
    for workers in (1, 2):
        args = ["convert", str(src), str(tmp_path / f"w{workers}" / "d-%04d.tar"), "--maxcount", "4"]
        assert main([*args, "--workers", str(workers), "--shuffle", "--seed", "7", "--quiet"]) == 0
    one, two = _digests(tmp_path / "w1"), _digests(tmp_path / "w2")
    assert one == two and len(one) == 8
    assert (tmp_path / "w1/d.manifest.json").read_bytes() == (tmp_path / "w2/d.manifest.json").read_bytes()
    order = [s["__key__"] for s in _read_back(tmp_path / "w1")]
    assert sorted(order) == sorted(k.rsplit(".", 1)[0] for k in _source_images(src)) and order != sorted(
        order
    )


def test_maxsize_cuts_where_webdataset_shardwriter_cuts(tmp_path):
    """The plan predicts ShardWriter's cuts from file sizes: same cuts as webdataset's writer."""
    src = _make_folder(tmp_path / "src", per_class=8, size=(20, 20))
    assert (
        main(["convert", str(src), str(tmp_path / "ours" / "s-%03d.tar"), "--maxsize", "3kB", "--quiet"]) == 0
    )
    (tmp_path / "ref").mkdir()
    with wds.ShardWriter(str(tmp_path / "ref" / "s-%03d.tar"), maxsize=3000, verbose=0) as writer:
        classes = sorted(p.name for p in src.iterdir())
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            relative = path.relative_to(src).as_posix()
            ext = path.suffix[1:].lower().replace("jpeg", "jpg")
            key = relative.rsplit(".", 1)[0]
            writer.write(
                {"__key__": key, ext: path.read_bytes(), "cls": str(classes.index(path.parent.name))}
            )
    assert _digests(tmp_path / "ours").keys() == _digests(tmp_path / "ref").keys()
    for ours, ref in zip(_shards(tmp_path / "ours"), _shards(tmp_path / "ref"), strict=True):
        with tarfile.open(ours) as a, tarfile.open(ref) as b:
            assert a.getnames() == b.getnames()


_SLOW_CONVERT = [
    sys.executable,
    "-m",
    "wdsx.commands.cli",
    "convert",
    "--maxcount",
    "2",
    "--reencode",
    "png",
    "--quiet",
]


@pytest.mark.slow  # SIGKILL of the converter
def test_resume_after_a_hard_kill_equals_an_uninterrupted_run(tmp_path):
    src = _make_folder(tmp_path / "src", per_class=30, size=(300, 200))
    reference = tmp_path / "reference"
    killed = tmp_path / "killed"
    convert(str(src), str(reference / "x"), ConvertSettings(maxcount=2, reencode="png"))
    total = len(_shards(reference))
    process = subprocess.Popen([*_SLOW_CONVERT, str(src), str(killed / "x")], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while len(_shards(killed) if killed.exists() else []) < 3:
            assert time.monotonic() < deadline, "no shard appeared"
            assert process.poll() is None, "the converter finished before it could be killed"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    done_before = len(_shards(killed))
    assert 3 <= done_before < total
    assert not (killed / "x.manifest.json").exists()
    report = convert(str(src), str(killed / "x"), ConvertSettings(maxcount=2, reencode="png"))
    assert report.reused >= done_before - 1  # a shard may lack its record if killed in between
    assert report.written + report.reused == total
    assert _digests(killed) == _digests(reference)
    assert (killed / "x.manifest.json").read_bytes() == (reference / "x.manifest.json").read_bytes()
    assert sorted(p.name for p in killed.iterdir()) == sorted(p.name for p in reference.iterdir())


def test_changed_settings_rewrite_instead_of_reusing(tmp_path):
    src = _make_folder(tmp_path / "src", per_class=4)
    first = convert(str(src), str(tmp_path / "o"), ConvertSettings(maxcount=3))
    again = convert(str(src), str(tmp_path / "o"), ConvertSettings(maxcount=3))
    changed = convert(str(src), str(tmp_path / "o"), ConvertSettings(maxcount=5))
    assert (first.written, again.written, again.reused) == (4, 0, 4)
    assert (changed.written, changed.reused) == (3, 0)
    assert Manifest.load(str(tmp_path / "o.manifest.json")).counts_for(["o-000000.tar"]) == [5]


def test_unreadable_images_are_skipped_and_reported(tmp_path, capsys):
    src = _make_folder(tmp_path / "src", per_class=3)
    good = (src / "cat" / "img000.jpg").read_bytes()
    (src / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (src / "dog" / "garbage.png").write_bytes(b"\x89PNG not really")
    assert main(["convert", str(src), str(tmp_path / "o" / "t"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "cat/truncated.jpg" in captured.err and "dog/garbage.png" in captured.err
    keys = {s["__key__"] for s in _read_back(tmp_path / "o")}
    assert len(keys) == 9 and "cat/truncated" not in keys and "dog/garbage" not in keys
    skipped = Manifest.load(str(tmp_path / "o" / "t.manifest.json")).extra["write"]["skipped_by_shard"]
    assert sorted(path for entries in skipped.values() for path, _ in entries) == [
        "cat/truncated.jpg",
        "dog/garbage.png",
    ]

    assert main(["convert", str(src), str(tmp_path / "o2" / "t")]) == 0
    assert "9 images, 2 skipped" in capsys.readouterr().out

    assert main(["convert", str(src), str(tmp_path / "strict" / "t"), "--strict", "--quiet"]) == 1
    assert "cat/truncated.jpg" in capsys.readouterr().err
    assert not (tmp_path / "strict" / "t.manifest.json").exists()


def test_decode_verification_catches_corrupt_pixels(tmp_path):
    src = _make_folder(tmp_path / "src", per_class=2, classes=("a",), size=(64, 64))
    data = bytearray((src / "a" / "img000.jpg").read_bytes())
    data[len(data) // 2 : len(data) // 2 + 40] = b"\xff\xd8" * 20  # markers inside the coded data
    (src / "a" / "img000.jpg").write_bytes(bytes(data))
    header = convert(str(src), str(tmp_path / "h"), ConvertSettings(verify="header"))
    decoded = convert(str(src), str(tmp_path / "d"), ConvertSettings(verify="decode"))
    assert header.skipped == []
    assert [path for path, _ in decoded.skipped] == ["a/img000.jpg"]


def test_reencode_and_resize(tmp_path):
    src = _make_folder(tmp_path / "src", per_class=2, classes=("a",), size=(40, 30))
    (src / "a" / "small.png").write_bytes(_image_bytes(9, (10, 8), "PNG"))
    convert(str(src), str(tmp_path / "r"), ConvertSettings(reencode="jpg", resize=15, quality=80))
    for sample in _read_back(tmp_path):
        image = Image.open(io.BytesIO(sample["jpg"]))
        assert image.format == "JPEG"
        assert image.size == ((10, 8) if sample["__key__"] == "a/small" else (20, 15))
    convert(str(src), str(tmp_path / "k" / "s"), ConvertSettings(resize=15))
    kept = {s["__key__"]: s for s in _read_back(tmp_path / "k")}
    assert kept["a/small"]["png"] == (src / "a" / "small.png").read_bytes()  # not larger: untouched
    assert Image.open(io.BytesIO(kept["a/img000"]["jpg"])).size == (20, 15)


def test_ranks_split_the_shards_without_overlap(tmp_path, monkeypatch):
    src = _make_folder(tmp_path / "src", per_class=5)
    args = ["convert", str(src), "--maxcount", "2", "--quiet"]
    assert main([*args[:2], str(tmp_path / "single" / "s"), *args[2:]]) == 0
    parts = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert main([*args[:2], str(tmp_path / f"rank{rank}" / "s"), *args[2:]]) == 0
        assert main([*args[:2], str(tmp_path / "shared" / "s"), *args[2:]]) == 0
        parts.append(_digests(tmp_path / f"rank{rank}"))
        assert (tmp_path / "shared" / "s.manifest.json").exists() == (rank == 1)
    single = _digests(tmp_path / "single")
    assert not parts[0].keys() & parts[1].keys()
    assert {**parts[0], **parts[1]} == single == _digests(tmp_path / "shared")
    shared_manifest = (tmp_path / "shared" / "s.manifest.json").read_bytes()
    assert shared_manifest == (tmp_path / "single" / "s.manifest.json").read_bytes()
    assert not [p for p in (tmp_path / "shared").iterdir() if p.name.startswith(".")]


def test_rank_from_environment():
    assert rank_and_world_size({}) == (0, 1)
    assert rank_and_world_size({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    assert rank_and_world_size({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}) == (1, 2)
    assert rank_and_world_size(
        {"RANK": "0", "WORLD_SIZE": "8", "SLURM_PROCID": "5", "SLURM_NTASKS": "9"}
    ) == (0, 8)


def test_errors_are_one_line(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nope"), str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    assert main(["convert", str(tmp_path / "empty"), str(tmp_path / "o")]) == 1
    assert "no images" in capsys.readouterr().err
    assert main(["convert", str(tmp_path), "o", "--reencode", "gif"]) == 2
    assert os.listdir(tmp_path) == ["empty"]


@pytest.mark.slow
def test_convert_to_s3_writes_the_same_shards_and_resumes(s3_server, s3_bucket, tmp_path):
    src = _make_folder(tmp_path / "src", per_class=4)
    settings = ConvertSettings(maxcount=5)
    convert(str(src), str(tmp_path / "local" / "t"), settings)
    url = f"s3://{s3_bucket}/data/t"
    first = convert(str(src), url, settings, workers=2, options=s3_server.options)
    again = convert(str(src), url, settings, options=s3_server.options)
    assert (first.written, again.written, again.reused) == (3, 0, 3)
    assert again.manifest_url == f"s3://{s3_bucket}/data/t.manifest.json"
    client = s3_server.client()
    for path in _shards(tmp_path / "local"):
        body = client.get_object(Bucket=s3_bucket, Key=f"data/{path.name}")["Body"].read()
        assert body == path.read_bytes()
    remote_manifest = Manifest.load(again.manifest_url, s3_server.options)
    assert remote_manifest == Manifest.load(str(tmp_path / "local" / "t.manifest.json"))


@pytest.mark.parametrize(
    ("table", "arguments", "said"),
    [
        ("id,text\n", ["--key", "id", "--field", "text=txt"], "the table has no records"),
        (
            "id,text\n1,a\n",
            ["--key", "nosuch", "--field", "text=txt"],
            "no column 'nosuch' (its columns: id, text)",
        ),
        ("id,text\n1,a\n", ["--key", "id", "--field", "words=txt"], "no column 'words'"),
    ],
)
def test_a_table_conversion_checks_its_columns_first(tmp_path, capsys, table, arguments, said):
    path = tmp_path / "t.csv"
    path.write_text(table)
    assert main(["convert", str(path), str(tmp_path / "out" / "x"), *arguments]) == 1
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
