"""The general writer: any inputs and a sample function -> shards and a manifest, the same bytes
from one process, several processes or launcher ranks, atomic, resumable, with clear reports.

Oracles: the inputs themselves and Python's tarfile/json/csv modules."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import wdsx
from tests.fixtures import samplefunctions as functions
from wdsx.write.dataset import write_dataset
from wdsx.write.jobs import WriteError

INPUTS = [{"n": n, "caption": f"caption number {n}"} for n in range(50)]


def read_back(directory: Path) -> dict[str, dict[str, bytes]]:
    """Every sample of every final shard in ``directory``, by key, read with tarfile."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(directory.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                data = tar.extractfile(member)
                assert data is not None
                samples.setdefault(key, {})[ext] = data.read()
    return samples


def files_of(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_samples_read_back_equal_to_their_inputs(tmp_path):
    report = write_dataset(INPUTS, functions.caption_sample, str(tmp_path / "out" / "train"), maxcount=8)
    assert (report.shards, report.written, report.samples) == (7, 7, 50)
    expected = {
        f"{n:09d}": {"txt": f"caption number {n}".encode(), "cls": str(n).encode()} for n in range(50)
    }
    assert read_back(tmp_path / "out") == expected
    manifest = json.loads((tmp_path / "out" / "train.manifest.json").read_text())
    assert [shard["samples"] for shard in manifest["shards"]] == [8] * 6 + [2]
    assert sorted(os.listdir(tmp_path / "out"))[0] == "train-000000.tar"  # no records left behind
    assert not [name for name in os.listdir(tmp_path / "out") if name.startswith(".")]


def test_the_dataset_reads_back_through_webdataset_api(tmp_path):
    write_dataset(INPUTS, functions.caption_sample, str(tmp_path / "t-%03d.tar"), maxcount=16)
    dataset = wdsx.WebDataset(str(tmp_path / "t-{000..003}.tar"), shardshuffle=False).decode()
    assert [(s["__key__"], s["txt"]) for s in dataset] == [
        (f"{n:09d}", f"caption number {n}") for n in range(50)
    ]


def test_one_process_two_processes_and_two_ranks_write_the_same_bytes(tmp_path):
    write_dataset(INPUTS, functions.caption_sample, str(tmp_path / "one" / "s"), maxcount=7, shuffle=True)
    write_dataset(
        INPUTS, functions.caption_sample, str(tmp_path / "two" / "s"), maxcount=7, shuffle=True, workers=2
    )
    first = write_dataset(
        INPUTS,
        functions.caption_sample,
        str(tmp_path / "ranks" / "s"),
        maxcount=7,
        shuffle=True,
        rank=1,
        world_size=2,
    )
    assert first.manifest_url is None  # rank 0's shards are not written yet
    last = write_dataset(
        INPUTS,
        functions.caption_sample,
        str(tmp_path / "ranks" / "s"),
        maxcount=7,
        shuffle=True,
        rank=0,
        world_size=2,
    )
    assert last.manifest_url == str(tmp_path / "ranks" / "s.manifest.json")
    assert files_of(tmp_path / "one") == files_of(tmp_path / "two") == files_of(tmp_path / "ranks")
    assert sorted(read_back(tmp_path / "one")) == [f"{n:09d}" for n in range(50)]


def test_a_rerun_rewrites_nothing_and_a_new_plan_rewrites_everything(tmp_path):
    dest = str(tmp_path / "s")
    write_dataset(INPUTS, functions.caption_sample, dest, maxcount=10)
    stamps = {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("*.tar")}
    again = write_dataset(INPUTS, functions.caption_sample, dest, maxcount=10)
    assert (again.written, again.reused, again.samples) == (0, 5, 50)
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.glob("*.tar")} == stamps
    changed = write_dataset(INPUTS, functions.caption_sample, dest, maxcount=10, version="2")
    assert (changed.written, changed.reused) == (5, 0)


def test_a_new_plan_with_fewer_shards_removes_the_earlier_plans_other_shards(tmp_path):
    out = tmp_path / "out"
    write_dataset(INPUTS, functions.caption_sample, str(out / "s"), maxcount=5)  # 10 shards
    (out / "s-000042.tar").write_bytes(b"not written by any plan")
    report = write_dataset(INPUTS, functions.caption_sample, str(out / "s"), maxcount=20)  # 3 shards
    assert report.removed == [str(out / f"s-{n:06d}.tar") for n in range(3, 10)]
    assert report.left == []
    assert (out / "s-000042.tar").read_bytes() == b"not written by any plan"  # left alone
    (out / "s-000042.tar").unlink()
    write_dataset(INPUTS, functions.caption_sample, str(tmp_path / "fresh" / "s"), maxcount=20)
    assert files_of(out) == files_of(tmp_path / "fresh")  # what a run into an empty folder leaves
    globbed = wdsx.WebDataset(str(out / "s-*.tar"), shardshuffle=False)
    assert [sample["__key__"] for sample in globbed] == [f"{n:09d}" for n in range(50)]


def test_a_new_plan_that_stops_midway_leaves_no_manifest_of_the_earlier_plan(tmp_path, monkeypatch):
    out = tmp_path / "out"
    write_dataset(INPUTS, functions.fails_from_thirty_while_marked, str(out / "s"), maxcount=5)  # 10 shards
    marker = tmp_path / "fail"
    marker.touch()
    monkeypatch.setenv("WDSX_TEST_FAIL", str(marker))
    with pytest.raises(WriteError):  # shard 0 (inputs 0-19) rewritten, shard 1 stops at input 30
        write_dataset(
            INPUTS, functions.fails_from_thirty_while_marked, str(out / "s"), maxcount=20, strict=True
        )
    assert not (out / "s.manifest.json").exists()
    on_disk = []  # every sample of every shard there, old and new, as tarfile reads them
    for shard in sorted(out.glob("s-*.tar")):
        with tarfile.open(shard) as tar:
            on_disk += sorted({member.name.partition(".")[0] for member in tar.getmembers()})
    globbed = wdsx.WebDataset(str(out / "s-*.tar"), shardshuffle=False)
    assert [sample["__key__"] for sample in globbed] == on_disk
    marker.unlink()
    report = write_dataset(
        INPUTS, functions.fails_from_thirty_while_marked, str(out / "s"), maxcount=20, strict=True
    )
    assert report.removed == [str(out / f"s-{n:06d}.tar") for n in range(3, 10)]
    write_dataset(
        INPUTS,
        functions.fails_from_thirty_while_marked,
        str(tmp_path / "fresh" / "s"),
        maxcount=20,
        strict=True,
    )
    assert files_of(out) == files_of(tmp_path / "fresh")  # the earlier manifest set aside is gone too


def test_a_new_plan_removes_the_shards_of_an_earlier_run_that_never_finished(tmp_path):
    dest = str(tmp_path / "s")
    write_dataset(INPUTS, functions.caption_sample, dest, maxcount=5, rank=1, world_size=2)
    assert not (tmp_path / "s.manifest.json").exists()  # rank 0's shards were never written
    earlier = sorted(name for name in os.listdir(tmp_path) if name.endswith(".tar"))
    assert earlier == [f"s-{n:06d}.tar" for n in range(1, 10, 2)]
    report = write_dataset(INPUTS, functions.caption_sample, dest, maxcount=25)  # 2 shards
    assert report.removed == [str(tmp_path / f"s-{n:06d}.tar") for n in (3, 5, 7, 9)]
    assert sorted(os.listdir(tmp_path)) == ["s-000000.tar", "s-000001.tar", "s.manifest.json"]


def test_inputs_can_give_several_samples_or_none(tmp_path):
    report = write_dataset(INPUTS, functions.pairs, str(tmp_path / "s"), maxcount=10)
    samples = read_back(tmp_path)
    expected_keys = sorted(k for n in range(0, 50, 2) for k in (f"{n:09d}", f"{n:09d}_1"))
    assert sorted(samples) == expected_keys
    assert samples["000000004_1"]["txt"] == b"CAPTION NUMBER 4"
    assert report.samples == 50


def test_a_failing_input_is_reported_and_left_out_or_stops_a_strict_run(tmp_path):
    report = write_dataset(INPUTS, functions.fails_on_sevens, str(tmp_path / "a" / "s"), maxcount=10)
    assert [reason for _, reason in report.skipped] == [
        f"ValueError: no sevens ({n})" for n in (7, 17, 27, 37, 47)
    ]
    assert len(read_back(tmp_path / "a")) == 45
    with pytest.raises(WriteError, match=r"'n': 7.*no sevens \(7\) \(strict\)"):
        write_dataset(INPUTS, functions.fails_on_sevens, str(tmp_path / "b" / "s"), maxcount=10, strict=True)
    assert not list((tmp_path / "b").glob("*.manifest.json"))


def test_a_function_that_returns_no_dict_is_reported(tmp_path):
    with pytest.raises(WriteError, match="no input gave a sample") as caught:
        write_dataset(["a", "b"], str.upper, str(tmp_path / "s"))
    reason = "TypeError: a sample must be a dict of fields, not str"
    assert caught.value.report.skipped == [("a", reason), ("b", reason)]
    assert os.listdir(tmp_path) == []  # "nothing usable was written": no empty shard either


def _run_writer_in_child(dest: Path, marker: Path) -> subprocess.Popen:
    code = (
        "from tests.fixtures import samplefunctions as f\n"
        "from tests.test_write_dataset import INPUTS\n"
        "from wdsx.write.dataset import write_dataset\n"
        f"write_dataset(INPUTS, f.slow_after_marker, {str(dest)!r}, maxcount=10, workers=2)\n"
    )
    env = {**os.environ, "WDSX_TEST_HANG": str(marker)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, cwd=Path(__file__).parent.parent, start_new_session=True
    )


def _wait_until_gone(group: int) -> None:
    """Wait until the killed process group's pool workers have exited too."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError("the killed writer's processes are still there")


def _every_final_shard_parses(directory: Path) -> None:
    for shard in directory.glob("*.tar"):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                assert tar.extractfile(member).read() is not None


@pytest.mark.slow
def test_a_killed_run_leaves_no_truncated_shard_and_a_rerun_finishes_it(tmp_path):
    marker = tmp_path / "hang"
    marker.touch()
    dest = tmp_path / "out" / "s"
    child = _run_writer_in_child(dest, marker)
    try:
        deadline = time.monotonic() + 60
        # a shard is done once its completion record follows it
        while len(list((tmp_path / "out").glob(".*.tar.json"))) < 3 and time.monotonic() < deadline:
            _every_final_shard_parses(tmp_path / "out")
            time.sleep(0.05)
        finished = {path.name: path.stat().st_mtime_ns for path in (tmp_path / "out").glob("*.tar")}
        assert len(finished) == 3  # shards 0-2 hold inputs 0-29; 3 and 4 hang
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        _wait_until_gone(child.pid)
    _every_final_shard_parses(tmp_path / "out")
    marker.unlink()
    report = write_dataset(INPUTS, functions.slow_after_marker, str(dest), maxcount=10)
    assert (report.written, report.reused) == (2, 3)
    assert {name: (tmp_path / "out" / name).stat().st_mtime_ns for name in finished} == finished
    write_dataset(INPUTS, functions.slow_after_marker, str(tmp_path / "clean" / "s"), maxcount=10)
    assert files_of(tmp_path / "clean") == files_of(tmp_path / "out")


def test_a_csv_file_converts_and_reads_back_equal(tmp_path):
    rows = [{"id": f"r{n}", "caption": f"a picture, number {n}", "score": str(n / 3)} for n in range(25)]
    with open(tmp_path / "table.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, ["id", "caption", "score"])
        writer.writeheader()
        writer.writerows(rows)
    assert (
        wdsx_cli(
            "convert",
            str(tmp_path / "table.csv"),
            str(tmp_path / "out" / "t"),
            "--key",
            "id",
            "--maxcount",
            "10",
        )
        == 0
    )
    with open(tmp_path / "table.csv", newline="") as file:
        oracle = {row["id"]: row for row in csv.DictReader(file)}
    assert {key: json.loads(fields["json"]) for key, fields in read_back(tmp_path / "out").items()} == oracle


def test_a_jsonl_file_converts_with_chosen_fields_and_files(tmp_path):
    (tmp_path / "img").mkdir()
    records = []
    for n in range(12):
        (tmp_path / "img" / f"{n}.bin").write_bytes(os.urandom(50 + n))
        records.append({"key": f"k{n}", "text": f"text {n}", "path": f"img/{n}.bin", "extra": [n]})
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = ["--key", "key", "--field", "text=txt", "--file", "path=bin", "--maxcount", "5"]
    assert wdsx_cli("convert", str(tmp_path / "records.jsonl"), str(tmp_path / "out") + "/", *args) == 0
    oracle = {}
    for line in (tmp_path / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        oracle[record["key"]] = {
            "txt": record["text"].encode(),
            "bin": (tmp_path / record["path"]).read_bytes(),
        }
    assert read_back(tmp_path / "out") == oracle


def test_a_parquet_table_converts(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow
    import pyarrow.parquet

    table = pyarrow.table({"caption": [f"c{n}" for n in range(9)], "n": list(range(9))})
    pyarrow.parquet.write_table(table, tmp_path / "t.parquet")
    assert wdsx_cli("convert", str(tmp_path / "t.parquet"), str(tmp_path / "out" / "p"), "--quiet") == 0
    oracle = pyarrow.parquet.read_table(tmp_path / "t.parquet").to_pylist()
    samples = read_back(tmp_path / "out")
    assert [json.loads(samples[f"{n:09d}"]["json"]) for n in range(9)] == oracle


def test_a_flat_folder_of_images_converts_unlabeled(tmp_path):
    from PIL import Image

    (tmp_path / "src" / "more").mkdir(parents=True)
    for name in ("a.png", "b.jpg", "more/c.png"):
        Image.new("RGB", (6, 5), (10, 20, 30)).save(tmp_path / "src" / name)
    assert wdsx_cli("convert", str(tmp_path / "src"), str(tmp_path / "out" / "f"), "--quiet") == 0
    oracle = {
        str(path.relative_to(tmp_path / "src")).rpartition(".")[0]: {path.suffix[1:]: path.read_bytes()}
        for path in (tmp_path / "src").rglob("*.*")
    }
    assert read_back(tmp_path / "out") == oracle
    manifest = json.loads((tmp_path / "out" / "f.manifest.json").read_text())
    assert "classes" not in manifest


def wdsx_cli(*args: str) -> int:
    from wdsx.commands.cli import main

    return main(list(args))


@pytest.mark.slow
def test_two_launcher_ranks_at_once_write_what_one_process_writes(tmp_path):
    """Two processes started as a launcher starts ranks (RANK/WORLD_SIZE), running at the same
    time: each writes its share, one of them the manifest; the bytes are one process's."""
    dest = str(tmp_path / "ranks" / "s")
    code = (
        "from tests.fixtures import samplefunctions as f\n"
        "from tests.test_write_dataset import INPUTS\n"
        "from wdsx.write.dataset import write_dataset\n"
        f"write_dataset(INPUTS, f.caption_sample, {dest!r}, maxcount=6, shuffle=True)\n"
    )
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)},
            cwd=Path(__file__).parent.parent,
        )
        for rank in (0, 1)
    ]
    assert [rank.wait(timeout=120) for rank in ranks] == [0, 0]
    write_dataset(INPUTS, functions.caption_sample, str(tmp_path / "one" / "s"), maxcount=6, shuffle=True)
    assert files_of(tmp_path / "one") == files_of(tmp_path / "ranks")
