"""The inspection subcommands: info, ls, cat, verify, bench (tarfile is the oracle)."""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import PIL.Image
import pytest

from tests.fixtures.shards import write_tar
from wdsx.commands import cli
from wdsx.write.writer import ShardWriter


def png(value: int) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.full((8, 8), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def written(tmp_path):
    """Two shards written by ShardWriter (so with a manifest)."""
    pattern = str(tmp_path / "set-%06d.tar")
    with ShardWriter(pattern, maxcount=5, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i:02d}", "png": png(i), "cls": i % 3, "txt": f"caption {i}"})
    return [pattern % n for n in range(2)]


def test_info_counts_samples_fields_and_classes(written, capsys):
    assert cli.main(["info", *written]) == 0
    out = capsys.readouterr().out
    assert "total: 2 shards, 10 samples" in out
    assert "png (10)" in out and "cls (10)" in out
    assert "     0" in out and "4" in out  # class 0 holds k00, k03, k06, k09


def test_ls_offsets_match_tarfile(written, capsys):
    assert cli.main(["ls", written[0]]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    with tarfile.open(written[0]) as archive:
        firsts = {}
        for member in archive.getmembers():
            firsts.setdefault(member.name.split(".")[0], member.offset)
    assert [(line[2], int(line[1])) for line in lines] == sorted(firsts.items(), key=lambda kv: kv[1])


def test_cat_extracts_identical_bytes(written, tmp_path, capsysbinary):
    with tarfile.open(written[1]) as archive:
        expected = archive.extractfile("k07.png").read()
    assert cli.main(["cat", written[1], "k07", "--field", "png"]) == 0
    assert capsysbinary.readouterr().out == expected
    assert cli.main(["cat", written[1], "k07", "--output", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "k07.png", "rb") as stream:
        assert stream.read() == expected
    assert cli.main(["cat", written[1], "nope"]) == 1


def test_verify_passes_sound_shards_and_catches_each_kind_of_damage(written, tmp_path, capsys):
    assert cli.main(["verify", *written]) == 0
    with open(written[1], "r+b") as stream:  # damage payload bytes: only the hash can tell
        stream.seek(512 + 10)
        stream.write(b"#")
    assert cli.main(["verify", *written]) == 1
    assert "sha256" in capsys.readouterr().out
    broken = write_tar(str(tmp_path / "broken.tar"), [("a.png", b"not a png"), ("a.cls", b"1")])
    assert cli.main(["verify", broken]) == 1
    assert "does not decode" in capsys.readouterr().out
    with open(broken, "r+b") as stream:
        stream.truncate(700)
    assert cli.main(["verify", broken]) == 1
    assert "truncated" in capsys.readouterr().out


def test_bench_reports_rates_and_step_times(written, capsys):
    assert cli.main(["bench", *written, "--decode", "l8", "--batch-size", "2", "--shuffle", "4"]) == 0
    out = capsys.readouterr().out
    assert "10 samples" in out and "samples/s" in out and "time to first batch" in out and "step time" in out


def test_unknown_shard_is_a_one_line_error(tmp_path, capsys):
    assert cli.main(["info", str(tmp_path / "missing.tar")]) == 1
    assert "missing.tar" in capsys.readouterr().err


def test_demo_data_is_shipped():
    root = os.path.join(os.path.dirname(__file__), "..", "data", "fashion-mnist-mini")
    classes = [d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))]
    assert len(classes) == 10


def test_index_and_verify_keep_each_folders_shards_to_its_own_manifest(tmp_path, capsys):
    """Two folders holding a shard of one name: a manifest each, and each shard checked
    against its own folder's (a manifest lists shards by name; the oracle is tarfile)."""
    urls = []
    for folder, count in (("a", 3), ("b", 5)):
        members = [(f"{folder}{i}.txt", b"x" * (i + 1)) for i in range(count)]
        (tmp_path / folder).mkdir()
        urls.append(write_tar(str(tmp_path / folder / "x.tar"), members))
    assert cli.main(["index", *urls]) == 0
    for url in urls:
        manifest = json.loads(open(os.path.join(os.path.dirname(url), "x.manifest.json")).read())
        with tarfile.open(url) as tar:
            assert [shard["samples"] for shard in manifest["shards"]] == [len(tar.getnames())]
    capsys.readouterr()
    assert cli.main(["verify", *urls]) == 0
    assert "2 of 2 shards ok" in capsys.readouterr().out
    assert cli.main(["index", *urls, "-o", str(tmp_path / "one.manifest.json")]) == 1
    assert "two shards named 'x.tar' would share a manifest" in capsys.readouterr().err


def test_index_fails_when_an_offset_index_cannot_be_written(tmp_path, capsys):
    path = tmp_path / "j-000.jsonl"
    path.write_text('{"text": "not a list"}\n')
    assert cli.main(["index", str(path), "--sizes", "--tokens-field", "text"]) == 1
    assert "'text' holds a str, not a list" in capsys.readouterr().err


def test_info_refuses_a_npy_shard_shorter_than_its_header(tmp_path, capsys):
    path = tmp_path / "rows.npy"
    np.save(path, np.zeros((100, 4), np.float32))
    path.write_bytes(path.read_bytes()[:-50])
    assert cli.main(["info", str(path)]) == 1
    assert "shorter than its header says" in capsys.readouterr().err


def test_info_names_only_the_classes_a_manifest_lists(tmp_path, capsys):
    with ShardWriter(str(tmp_path / "c-%d.tar"), verbose=0, metadata={"classes": ["cat", "dog"]}) as sink:
        for key, cls in (("a", -1), ("b", 0), ("c", "tabby")):
            sink.write({"__key__": key, "cls": cls if isinstance(cls, int) else cls.encode()})
    assert cli.main(["info", str(tmp_path / "c-0.tar")]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert lines == [["-1", "1"], ["0", "cat", "1"], ["tabby", "1"]]


def test_cat_searches_every_shard_of_a_pattern(written, capsys):
    pattern = written[0].replace("set-000000.tar", "set-{000000..000001}.tar")
    assert cli.main(["cat", pattern, "k07"]) == 0
    assert "__key__: k07" in capsys.readouterr().out


def test_index_output_into_a_folder_leaves_no_temporary_file(written, tmp_path, capsys):
    folder = tmp_path / "out"
    folder.mkdir()
    assert cli.main(["index", written[0], "-o", str(folder)]) == 1
    assert "cannot write the file there" in capsys.readouterr().err
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]
