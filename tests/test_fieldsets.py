"""Field sets: new fields in shards of their own, joined to the base samples by key.

Oracles: field shards and their manifest built by hand here with Python's tarfile and json
(the test's own table of which key gets which field), the base shards' keys from
``make_shards``, uninterrupted runs (for resume), and the full list of keys (for re-deals).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import tarfile
from collections import Counter
from pathlib import Path

import pytest

import wdsx
from tests.fixtures.shards import Shards, make_shards, write_tar
from wdsx.commands import cli
from wdsx.core.errors import ShardError
from wdsx.read.manifest import Manifest, build_manifest
from wdsx.write.fieldsets import write_field_set
from wdsx.write.jobs import WriteError

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "data" / "fashion-mnist-mini"
COUNTS = [7, 5, 9, 6]


def caption(key: str) -> bytes:
    return f"a caption for {key}".encode()


def write_field_set_by_hand(
    directory: str, base: Shards, drop: frozenset[str] = frozenset(), base_sha256: str | None = None
) -> dict[str, bytes]:
    """A field set with a ``cap`` field for every base key but ``drop``, built with tarfile and
    json; returns key -> caption of the entries written."""
    os.makedirs(directory, exist_ok=True)
    shards, made_for, missing, captions = [], [], {}, {}
    start = 0
    for url, count in zip(base.urls, base.counts):
        keys = base.keys[start : start + count]
        start += count
        kept = [key for key in keys if key not in drop]
        name = os.path.basename(url)
        path = write_tar(os.path.join(directory, name), [(f"{key}.cap", caption(key)) for key in kept])
        data = Path(path).read_bytes()
        shards.append({"name": name, "samples": len(kept), "bytes": len(data), "sha256": sha256_of(path)})
        made_for.append({"name": name, "samples": count, "sha256": base_sha256 or sha256_of(url)})
        if len(kept) != count:
            missing[name] = count - len(kept)
        captions.update((key, caption(key)) for key in kept)
    record = {"version": 1, "base": made_for, "fields": ["cap"], "missing": missing}
    manifest = {
        "format": "wdsx-manifest",
        "version": 1,
        "total_samples": sum(shard["samples"] for shard in shards),
        "field_set": record,
        "shards": shards,
    }
    Path(directory, "captions.manifest.json").write_text(json.dumps(manifest))
    return captions


def sha256_of(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def rewrite_members(path: str, change) -> None:
    """Rewrite the tar at ``path`` with ``change(members)`` applied to its (name, data) list."""
    with tarfile.open(path) as archive:
        members = [(info.name, archive.extractfile(info).read()) for info in archive.getmembers()]
    write_tar(path, change(members))


@pytest.fixture
def base(tmp_path) -> Shards:
    return make_shards(str(tmp_path / "base"), COUNTS)


@pytest.fixture
def captions(tmp_path, base) -> dict[str, bytes]:
    return write_field_set_by_hand(str(tmp_path / "captions"), base)


def read_all(base: Shards, **kwargs) -> list[dict]:
    return list(wdsx.WebDataset(base.urls, manifest=False, **kwargs))


def test_joined_samples_are_the_base_samples_plus_the_new_fields(tmp_path, base, captions):
    samples = read_all(base, fields=[str(tmp_path / "captions")])
    assert [sample["__key__"] for sample in samples] == base.keys
    for sample in samples:
        key = sample["__key__"]
        assert sample["txt"] == key.encode().ljust(20, b".")
        assert sample["cls"] == str(int(key[-5:]) % 10).encode()
        assert sample["cap"] == captions[key]
        assert sample["__url__"].startswith(base.directory)


def test_a_field_set_is_named_by_its_manifest_url_too(tmp_path, base, captions):
    samples = read_all(base, fields=str(tmp_path / "captions" / "captions.manifest.json"))
    assert {sample["__key__"]: sample["cap"] for sample in samples} == captions


def test_two_field_sets_join_together(tmp_path, base, captions):
    other = tmp_path / "labels"
    shutil.copytree(tmp_path / "captions", other)
    for name in os.listdir(other):
        if name.endswith(".tar"):
            rewrite_members(
                str(other / name), lambda ms: [(n.replace(".cap", ".lbl"), d[::-1]) for n, d in ms]
            )
    manifest = json.loads((other / "captions.manifest.json").read_text())
    for shard in manifest["shards"]:
        shard["sha256"] = sha256_of(str(other / shard["name"]))
    (other / "captions.manifest.json").write_text(json.dumps(manifest))
    samples = read_all(base, fields=[str(tmp_path / "captions"), str(other)])
    assert all(
        s["lbl"] == captions[s["__key__"]][::-1] and s["cap"] == captions[s["__key__"]] for s in samples
    )


def loader(base: Shards, fields: str, missing: str = "error", workers: int | None = None):
    dataset = (
        wdsx.WebDataset(base.urls, shardshuffle=True, seed=3, fields=[fields], missing_fields=missing)
        .shuffle(8)
        .to_tuple("__key__", "cap")
        .batched(3)
    )
    return dataset if workers is None else wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def test_check_resume_passes_on_a_joined_dataset(tmp_path, base, captions):
    report = wdsx.check_resume(lambda: loader(base, str(tmp_path / "captions")), cuts=3, epochs=2)
    assert report.identical, str(report)


def test_check_resume_passes_in_skip_mode_with_missing_keys(tmp_path, base):
    dropped = frozenset(base.keys[1::4])
    write_field_set_by_hand(str(tmp_path / "some"), base, drop=dropped)
    report = wdsx.check_resume(lambda: loader(base, str(tmp_path / "some"), "skip"), cuts=3, epochs=2)
    assert report.identical, str(report)


@pytest.mark.slow  # DataLoader worker processes
def test_check_resume_passes_with_workers(tmp_path, base, captions):
    report = wdsx.check_resume(lambda: loader(base, str(tmp_path / "captions"), workers=2), cuts=2)
    assert report.identical, str(report)


def test_an_elastic_re_deal_delivers_every_sample_once_with_its_fields(tmp_path, base, captions, monkeypatch):
    def make() -> wdsx.WebLoader:
        dataset = (
            wdsx.WebDataset(
                base.urls,
                shardshuffle=True,
                fields=[str(tmp_path / "captions")],
                counts="scan",
                remainder="exact",
            )
            .shuffle(5)
            .batched(2, collation_fn=list)
        )
        return wdsx.WebLoader(dataset, batch_size=None, num_workers=0)

    consumed, states, after = [], [], []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        first = make()
        iterator = iter(first)
        consumed += [next(iterator) for _ in range(3)]
        states.append(json.loads(json.dumps(first.state_dict())))
        del iterator
    everything = {"format": "wdsx-global-state", "version": 1, "ranks": states}
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        second = make()
        second.load_state_dict(json.loads(json.dumps(everything)))
        after += list(second)
    samples = [sample for batch in consumed + after for sample in batch]
    assert Counter(sample["__key__"] for sample in samples) == Counter(base.keys)
    assert all(sample["cap"] == captions[sample["__key__"]] for sample in samples)


def test_a_key_missing_from_a_field_shard_is_an_error_naming_shard_and_key(tmp_path, base, captions):
    field_shard = str(tmp_path / "captions" / "shard-000002.tar")
    rewrite_members(field_shard, lambda members: [m for m in members if not m[0].startswith("s002/00004.")])
    with pytest.raises(ShardError) as caught:
        read_all(base, fields=[str(tmp_path / "captions")])
    message = str(caught.value)
    assert caught.value.url == field_shard
    assert "'s002/00004'" in message and "'s002/00005'" in message
    assert caught.value.offset is not None


def test_skip_mode_drops_base_samples_without_an_entry(tmp_path, base):
    dropped = frozenset([base.keys[0], base.keys[9], base.keys[-1]])
    captions = write_field_set_by_hand(str(tmp_path / "some"), base, drop=dropped)
    samples = read_all(base, fields=[str(tmp_path / "some")], missing_fields="skip")
    assert [s["__key__"] for s in samples] == [key for key in base.keys if key not in dropped]
    assert all(s["cap"] == captions[s["__key__"]] for s in samples)


def test_skip_mode_drops_field_samples_whose_key_is_not_in_the_base(tmp_path, base, captions):
    field_shard = str(tmp_path / "captions" / "shard-000001.tar")
    rewrite_members(field_shard, lambda members: [("stranger.cap", b"?"), *members, ("zzz.cap", b"?")])
    samples = read_all(base, fields=[str(tmp_path / "captions")], missing_fields="skip")
    assert [s["__key__"] for s in samples] == base.keys
    with pytest.raises(ShardError, match="'stranger'"):
        read_all(base, fields=[str(tmp_path / "captions")])


def test_a_field_shard_that_goes_on_past_its_base_shard_is_an_error(tmp_path, base, captions):
    field_shard = str(tmp_path / "captions" / "shard-000003.tar")
    rewrite_members(field_shard, lambda members: [*members, ("zzz.cap", b"one too many")])
    with pytest.raises(ShardError, match="'zzz' comes after the last of the 6 samples"):
        read_all(base, fields=[str(tmp_path / "captions")])


def test_a_field_in_both_base_and_field_set_needs_overwrite(tmp_path, base, captions):
    for name in os.listdir(tmp_path / "captions"):
        if name.endswith(".tar"):
            rewrite_members(
                str(tmp_path / "captions" / name), lambda ms: [(n[:-3] + "txt", d) for n, d in ms]
            )
    with pytest.raises(ShardError, match="already has a field 'txt'"):
        read_all(base, fields=[str(tmp_path / "captions")])
    samples = read_all(base, fields=[str(tmp_path / "captions")], overwrite_fields=True)
    assert [s["txt"] for s in samples] == [captions[key] for key in base.keys]


def test_a_field_set_made_for_another_version_of_a_shard_is_refused(tmp_path, base):
    write_field_set_by_hand(str(tmp_path / "old"), base, base_sha256="0" * 64)
    build_manifest(base.urls).write(os.path.join(base.directory, "shard.manifest.json"))
    with pytest.raises(ShardError, match="made for another version"):
        list(wdsx.WebDataset(base.urls, fields=[str(tmp_path / "old")]))


def test_a_base_shard_the_field_set_does_not_cover_is_an_error_naming_both(tmp_path, base, captions):
    extra = make_shards(str(tmp_path / "more"), [2])
    os.rename(extra.urls[0], os.path.join(extra.directory, "other-000000.tar"))
    stray = os.path.join(extra.directory, "other-000000.tar")
    with pytest.raises(ShardError) as caught:
        list(wdsx.WebDataset([*base.urls, stray], manifest=False, fields=[str(tmp_path / "captions")]))
    assert stray in str(caught.value) and "captions.manifest.json" in str(caught.value)


def small_demo_folder(root: Path, per_class: int = 4) -> Path:
    """A few images of each class of the demo's image folder."""
    for folder in sorted(p for p in MINI.iterdir() if p.is_dir()):
        (root / folder.name).mkdir(parents=True)
        for image in sorted(folder.iterdir())[:per_class]:
            shutil.copy(image, root / folder.name / image.name)
    return root


def describe_image(sample: dict) -> dict | None:
    """The new fields of a demo sample: its image's byte count, none for class 3."""
    if int(sample["cls"]) == 3:
        return None
    return {"size.txt": str(len(sample["png"]))}


def test_write_field_set_on_the_demo_shards_reads_back_joined(tmp_path):
    source = small_demo_folder(tmp_path / "images")
    cli.main(["convert", str(source), str(tmp_path / "demo" / "fmnist"), "--maxcount", "12", "--quiet"])
    base_manifest = str(tmp_path / "demo" / "fmnist.manifest.json")
    report = write_field_set(base_manifest, str(tmp_path / "sizes"), describe_image)
    assert report.written == report.shards == 4 and report.manifest_url is not None
    urls = wdsx.WebDataset(base_manifest.replace(".manifest.json", "-{000000..000003}.tar")).urls
    plain = list(wdsx.WebDataset(urls))
    joined = list(wdsx.WebDataset(urls, fields=[str(tmp_path / "sizes")], missing_fields="skip"))
    expected = [s for s in plain if int(s["cls"]) != 3]
    assert [s["__key__"] for s in joined] == [s["__key__"] for s in expected]
    assert all(s["size.txt"] == str(len(s["png"])).encode() for s in joined)
    record = Manifest.load(report.manifest_url).extra["field_set"]
    base_entries = Manifest.load(base_manifest).shards
    assert record["base"] == [
        {"name": e.name, "samples": e.samples, "sha256": e.sha256} for e in base_entries
    ]
    assert record["fields"] == ["size.txt"]
    classes = Counter(os.path.basename(s["__url__"]) for s in plain if int(s["cls"]) == 3)
    assert record["missing"] == dict(classes)
    with pytest.raises(ShardError, match="missing_fields='skip'"):
        list(wdsx.WebDataset(urls, fields=[str(tmp_path / "sizes")]))
    again = write_field_set(base_manifest, str(tmp_path / "sizes"), describe_image)
    assert (again.written, again.reused) == (0, 4)


def test_skip_mode_joins_by_key_whatever_the_field_sets_order(tmp_path, base, captions):
    for shard in (tmp_path / "captions").glob("*.tar"):
        rewrite_members(str(shard), lambda members: members[::-1])
    samples = read_all(base, fields=[str(tmp_path / "captions")], missing_fields="skip")
    assert [(s["__key__"], s["cap"]) for s in samples] == [(key, captions[key]) for key in base.keys]
    report = wdsx.check_resume(lambda: loader(base, str(tmp_path / "captions"), "skip"), cuts=2)
    assert report.identical, str(report)


def test_the_functional_reader_joins_field_sets(tmp_path, base, captions):
    pipeline = wdsx.DataPipeline(
        wdsx.SimpleShardList(base.urls), wdsx.tarfile_to_samples(fields=str(tmp_path / "captions"))
    )
    assert [(s["__key__"], s["cap"]) for s in pipeline] == [(key, captions[key]) for key in base.keys]


def caption_or_fail(sample: dict) -> dict:
    """A caption, except for keys ending in 3, where the function fails."""
    if sample["__key__"].endswith("3"):
        raise RuntimeError("no caption today")
    return {"cap": caption(sample["__key__"])}


def test_a_sample_whose_function_raises_gets_no_entry_and_a_warning(tmp_path, base):
    report = write_field_set(base.urls, str(tmp_path / "made"), caption_or_fail)
    failing = [key for key in base.keys if key.endswith("3")]
    assert len(report.warnings) == len(failing) and "no caption today" in report.warnings[0][1]
    samples = read_all(base, fields=[str(tmp_path / "made")], missing_fields="skip")
    assert [s["__key__"] for s in samples] == [key for key in base.keys if key not in failing]
    assert all(s["cap"] == caption(s["__key__"]) for s in samples)
    record = Manifest.load(report.manifest_url).extra["field_set"]
    assert record["missing"] == {f"shard-{n:06d}.tar": 1 for n, count in enumerate(COUNTS) if count > 3}
    with pytest.raises(WriteError, match="no caption today"):
        write_field_set(base.urls, str(tmp_path / "strict"), caption_or_fail, strict=True)


def test_a_value_that_cannot_be_encoded_costs_only_its_own_sample(tmp_path, base):
    """An int in a text field is refused by the encoder, for that sample alone: the samples
    after it in the same base shard keep their entries."""

    def text_or_number(sample):
        return {"n.txt": 3 if sample["__key__"] == base.keys[1] else "ok", "z.txt.gz": "zipped"}

    report = write_field_set(base.urls, str(tmp_path / "made"), text_or_number)
    assert len(report.warnings) == 1 and base.keys[1] in report.warnings[0][1]
    assert not report.skipped
    samples = read_all(base, fields=[str(tmp_path / "made")], missing_fields="skip")
    assert [s["__key__"] for s in samples] == [key for key in base.keys if key != base.keys[1]]
    assert all(s["n.txt"] == b"ok" for s in samples)
    assert all(gzip.decompress(s["z.txt.gz"]) == b"zipped" for s in samples)  # compressed once
    with pytest.raises(WriteError, match="n.txt"):
        write_field_set(base.urls, str(tmp_path / "strict"), text_or_number, strict=True)


@pytest.mark.slow  # worker processes
def test_worker_processes_write_the_same_field_shards(tmp_path, base):
    one = write_field_set(base.urls, str(tmp_path / "one"), caption_or_fail)
    two = write_field_set(base.urls, str(tmp_path / "two"), caption_or_fail, workers=2)
    assert Path(one.manifest_url).read_text() == Path(two.manifest_url).read_text()
    for shard in (tmp_path / "one").glob("*.tar"):
        assert shard.read_bytes() == (tmp_path / "two" / shard.name).read_bytes()


def image_size(sample: dict) -> dict:
    """A new field for every demo sample: its image's byte count."""
    return {"size.txt": str(len(sample["png"]))}


def test_a_field_set_on_the_demo_shards_resumes_exactly_and_a_deleted_key_is_named(tmp_path):
    source = small_demo_folder(tmp_path / "images")
    cli.main(["convert", str(source), str(tmp_path / "demo" / "fmnist"), "--maxcount", "12", "--quiet"])
    base_manifest = str(tmp_path / "demo" / "fmnist.manifest.json")
    write_field_set(base_manifest, str(tmp_path / "sizes"), image_size)
    urls = wdsx.WebDataset(base_manifest.replace(".manifest.json", "-{000000..000003}.tar")).urls

    def make_loader():
        return (
            wdsx.WebDataset(urls, shardshuffle=True, seed=5, fields=[str(tmp_path / "sizes")])
            .shuffle(10)
            .to_tuple("__key__", "size.txt", "png")
            .batched(4)
        )

    report = wdsx.check_resume(make_loader, cuts=3, epochs=2)
    assert report.identical, str(report)
    joined = [sample for batch in make_loader() for sample in zip(*batch)]
    assert sorted(key for key, _, _ in joined) == sorted(s["__key__"] for s in wdsx.WebDataset(urls))
    assert all(size == str(len(png)).encode() for _, size, png in joined)
    field_shard = str(tmp_path / "sizes" / "fmnist-000001.tar")
    with tarfile.open(field_shard) as archive:
        deleted = archive.getnames()[5].partition(".")[0]
    rewrite_members(field_shard, lambda members: [m for m in members if not m[0].startswith(deleted + ".")])
    with pytest.raises(ShardError) as caught:
        list(wdsx.WebDataset(urls, shardshuffle=False, fields=[str(tmp_path / "sizes")]))
    assert caught.value.url == field_shard and repr(deleted) in str(caught.value)


def test_skip_mode_refuses_a_key_held_by_two_samples(tmp_path):
    """Joined by key, two samples of one key cannot be told apart: refused, in the field shard
    (both got fields) and in the base shard (one did), naming the shard and the offset."""
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    url = write_tar(str(base_dir / "part-000000.tar"), [("a.txt", b"0"), ("b.txt", b"1"), ("a.txt", b"2")])
    cases = (("both", ["a", "b", "a"], "field shard"), ("one", ["a", "b", "c"], "base shard"))
    for name, keys, shard in cases:
        listed = Shards(str(base_dir), [url], keys, [3])
        write_field_set_by_hand(str(tmp_path / name), listed, base_sha256=sha256_of(url))
        fields = [str(tmp_path / name / "captions.manifest.json")]
        with pytest.raises(ShardError, match=f"key 'a' is held by two samples of the {shard}") as caught:
            list(wdsx.WebDataset(url, manifest=False, fields=fields, missing_fields="skip"))
        where = str(tmp_path / name / "part-000000.tar") if shard == "field shard" else url
        with tarfile.open(where) as tar:
            second_a = tar.getmembers()[2].offset
        assert caught.value.url == where and caught.value.offset == second_a
