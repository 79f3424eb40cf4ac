"""Manifests: naming, lookups, merging, and header-scan counts against webdataset's grouping."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from webdataset import tariterators

from wdsx.commands.cli import main
from wdsx.errors import ShardError
from wdsx.read.manifest import (
    Manifest,
    ShardEntry,
    build_manifest,
    manifest_url_for_pattern,
    manifest_url_for_shard,
    scan_counts,
)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("out/train-%06d.tar", "out/train.manifest.json"),
        ("s3://b/p/%05d.tar", "s3://b/p/manifest.json"),
        ("/abs/imagenet_val.%04d.tar.gz", "/abs/imagenet_val.manifest.json"),
        ("shard-%d.tar", "shard.manifest.json"),
        ("a.b/c_-%03d.tgz", "a.b/c.manifest.json"),
        ("out/a-%06d-train.tar", "out/a-train.manifest.json"),
        ("x_%04d_val.jsonl.gz", "x-val.manifest.json"),
        ("%05d-b.tar", "b.manifest.json"),
    ],
)
def test_manifest_url_for_pattern(pattern, expected):
    assert manifest_url_for_pattern(pattern) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("out/train-000003.tar", "out/train.manifest.json"),
        ("s3://b/p/00005.tar", "s3://b/p/manifest.json"),
        ("/abs/imagenet_val.0001.tar.gz", "/abs/imagenet_val.manifest.json"),
        ("x/data-7.tgz", "x/data.manifest.json"),
        ("shard-12.tar", "shard.manifest.json"),
        ("v2/data.tar", "v2/data.manifest.json"),
        ("imagenet1k-train.tar", "imagenet1k-train.manifest.json"),  # alone: its trailing digits
        ("a-000003-train.tar", "a-000003-train.manifest.json"),
    ],
)
def test_manifest_url_for_shard(url, expected):
    assert manifest_url_for_shard(url) == expected


@pytest.mark.parametrize(
    ("pattern", "number_ends_name"),
    [
        ("out/train-%06d.tar", True),
        ("s3://b/p/%05d.tar", True),
        ("d/x_%d.tar.gz", True),
        ("laion-2024-%06d.tar", True),
        ("x-%04x.tar", True),  # while the shards' numbers are written in decimal digits
        ("a-%06d-b.tar", False),
        ("x_%04d_val.tgz", False),
        ("shard-%06d-of-000100.tar", False),
        ("shard-%05d.v2.tar", False),
        ("data-%06d-2024.tar", False),
    ],
)
def test_pattern_and_shard_names_agree(pattern, number_ends_name):
    """What a writer names the manifest of a pattern, a reader finds from the shards' names:
    from one shard where the number ends the name, else from the dataset's shards together."""
    shards = [pattern % number for number in range(4)]
    expected = manifest_url_for_pattern(pattern)
    assert all(manifest_url_for_shard(shard, shards) == expected for shard in shards)
    assert (manifest_url_for_shard(shards[0]) == expected) == number_ends_name


def test_a_manifest_written_for_text_after_the_number_is_found_and_checked(tmp_path):
    """ShardWriter names the manifest of ``a-%06d-b.tar`` where readers and ``verify`` look
    for it, so a shard rewritten afterwards (here by hand, with tarfile) fails the check."""
    import wdsx

    with wdsx.ShardWriter(str(tmp_path / "a-%06d-b.tar"), maxcount=5, verbose=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i}", "txt": "x"})
    assert (tmp_path / "a-b.manifest.json").exists()
    urls = str(tmp_path / "a-{000000..000001}-b.tar")
    assert main(["verify", urls, "--no-images"]) == 0
    with tarfile.open(tmp_path / "a-000001-b.tar", "w") as archive:
        info = tarfile.TarInfo("z.txt")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"y"))
    assert main(["verify", urls, "--no-images"]) == 1
    with pytest.raises(ShardError, match="sample count"):
        list(wdsx.WebDataset(urls, shardshuffle=False))


def _write(pattern: str, shards: int, start: int = 0) -> None:
    import wdsx

    with wdsx.ShardWriter(pattern, maxcount=1, verbose=0, start_shard=start) as sink:
        for i in range(shards):
            sink.write({"__key__": f"k{start + i}", "txt": "x"})


def test_a_dataset_of_one_shard_with_text_after_its_number_finds_its_manifest(tmp_path):
    import wdsx

    _write(str(tmp_path / "imagenet-%06d-val.tar"), 1)
    shard = str(tmp_path / "imagenet-000000-val.tar")
    assert wdsx.WebDataset(shard).manifest is not None
    assert main(["verify", shard, "--no-images"]) == 0
    with tarfile.open(shard, "w") as archive:  # rewritten: the manifest must catch it
        archive.addfile(tarfile.TarInfo("other.txt"), io.BytesIO(b""))
    assert main(["verify", shard, "--no-images"]) == 1


def test_families_of_one_shard_each_and_a_large_family_beside_a_small_one_are_each_checked(tmp_path, capsys):
    """Readers find each family's manifest: one shard per rank (``val_{rank}_%06d``), and a
    family of 70 shards listed before one of 2 (the small one is not judged by the large)."""
    for rank in range(3):
        _write(str(tmp_path / "ranks" / f"val_{rank}_%06d.tar"), 1)
    _write(str(tmp_path / "two" / "train-%05d-of-00070.tar"), 70)
    _write(str(tmp_path / "two" / "val-%05d-of-00002.tar"), 2)
    for folder in ("ranks", "two"):
        assert main(["verify", str(tmp_path / folder), "--no-images"]) == 0
        out = capsys.readouterr().out
        assert "no manifest" not in out and "not listed" not in out
    with tarfile.open(tmp_path / "two" / "val-00001-of-00002.tar", "w") as archive:
        archive.addfile(tarfile.TarInfo("other.txt"), io.BytesIO(b""))
    assert main(["verify", str(tmp_path / "two"), "--no-images"]) == 1
    assert "val-00001-of-00002.tar" in capsys.readouterr().out


def test_appending_to_a_hex_pattern_keeps_every_earlier_shard_listed(tmp_path):
    _write(str(tmp_path / "x-%04x.tar"), 10)
    _write(str(tmp_path / "x-%04x.tar"), 2, start=10)
    listed = [entry.name for entry in Manifest.load(str(tmp_path / "x.manifest.json")).shards]
    assert listed == [f"x-{n:04x}.tar" for n in range(12)]


def _manifest() -> Manifest:
    shards = [ShardEntry("s-10.tar", 3, 100, "aa"), ShardEntry("s-2.tar", 5, 200, None)]
    return Manifest(shards, {"classes": ["cat", "dog"]})


def test_lookups_by_basename():
    manifest = _manifest()
    assert manifest.counts_for(["/x/s-2.tar", "s3://b/s-10.tar"]) == [5, 3]
    assert manifest.counts_for(["s-2.tar", "s-3.tar"]) is None
    assert manifest.sha256_for("any/where/s-10.tar") == "aa"
    assert manifest.sha256_for("s-2.tar") is None
    assert manifest.total_samples == 8


def test_json_round_trip_and_validation():
    manifest = _manifest()
    assert Manifest.from_json(manifest.to_json()) == manifest
    with pytest.raises(ValueError, match="not a wdsx manifest"):
        Manifest.from_json('{"shards": []}')
    with pytest.raises(ValueError, match="version"):
        Manifest.from_json('{"format": "wdsx-manifest", "version": 99, "shards": []}')
    with pytest.raises(ValueError, match="total_samples"):
        Manifest.from_json('{"format": "wdsx-manifest", "version": 1, "total_samples": 2, "shards": []}')


def test_load_and_write(tmp_path):
    url = str(tmp_path / "sub" / "d.manifest.json")
    assert Manifest.load(url) is None
    _manifest().write(url)
    assert Manifest.load(url) == _manifest()
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["d.manifest.json"]


def test_merge():
    a = Manifest([ShardEntry("s-10.tar", 1, 10, "x")], {"classes": ["c"]})
    b = Manifest([ShardEntry("s-2.tar", 2, 20, "y"), ShardEntry("s-10.tar", 1, 10, "x")], {"classes": ["c"]})
    merged = Manifest.merge([a, b])
    assert [s.name for s in merged.shards] == ["s-2.tar", "s-10.tar"]
    assert merged.extra == {"classes": ["c"]}
    with pytest.raises(ValueError, match="s-10.tar"):
        Manifest.merge([a, Manifest([ShardEntry("s-10.tar", 9, 10, "x")])])
    with pytest.raises(ValueError, match="classes"):
        Manifest.merge([a, Manifest([], {"classes": ["d"]})])


# --- counting samples by scanning headers, against webdataset's grouping --------------------

KEYS = ["a", "b", "d/a", "d.x/a", "D/a", "__meta__", "__m__/a", "x/__m__/a", "__k", ".hidden", "a.b"]
EXTS = ["jpg", "JPG", "txt", "seg.png", "json", None]
member = st.tuples(st.sampled_from(KEYS), st.sampled_from(EXTS), st.booleans())


def _build_tar(members, tar_format: int, compress: bool, long_prefix: bool) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz" if compress else "w", format=tar_format) as tar:
        for key, ext, as_directory in members:
            name = key if ext is None else f"{key}.{ext}"
            if long_prefix:
                name = "p" * 120 + "/" + name
            info = tarfile.TarInfo(name)
            if as_directory:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return out.getvalue()


def _webdataset_count(path: str) -> int:
    with open(path, "rb") as stream:
        files = tariterators.tar_file_expander([{"url": path, "stream": stream}])
        return sum(1 for _ in tariterators.group_by_keys(files))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    members=st.lists(member, max_size=12),
    tar_format=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]),
    compress=st.booleans(),
    long_prefix=st.booleans(),
)
def test_scan_counts_groups_like_webdataset(tmp_path, members, tar_format, compress, long_prefix):
    if long_prefix and tar_format == tarfile.USTAR_FORMAT:
        tar_format = tarfile.PAX_FORMAT
    path = str(tmp_path / "t.tar")
    with open(path, "wb") as file:
        file.write(_build_tar(members, tar_format, compress, long_prefix))
    try:
        expected = _webdataset_count(path)
    except ValueError:  # a repeated extension within one sample
        with pytest.raises((ValueError, ShardError), match="duplicate"):
            scan_counts(path)
        return
    assert scan_counts(path) == expected


def test_build_manifest_and_index_command(tmp_path):
    members = [("a", "jpg", False), ("a", "txt", False), ("b", "jpg", False), ("a", "jpg", False)]
    for i in range(3):
        (tmp_path / f"data-{i}.tar").write_bytes(
            _build_tar(members[: i + 2], tarfile.USTAR_FORMAT, i == 2, False)
        )
    urls = [str(tmp_path / f"data-{i}.tar") for i in range(3)]
    manifest = build_manifest(urls)
    for url, entry in zip(urls, manifest.shards, strict=True):
        data = open(url, "rb").read()
        assert (entry.samples, entry.bytes) == (_webdataset_count(url), len(data))
        assert entry.sha256 == hashlib.sha256(data).hexdigest()
    assert main(["index", str(tmp_path / "data-{0..2}.tar")]) == 0
    assert Manifest.load(str(tmp_path / "data.manifest.json")) == manifest
    assert main(["index", str(tmp_path / "missing.tar")]) == 1


def test_a_manifest_describes_only_the_shards_beside_it(tmp_path):
    import wdsx
    from wdsx.write.writer import ShardWriter

    for folder in ("a", "b"):
        with ShardWriter(str(tmp_path / folder / "train-%06d.tar"), maxcount=3, verbose=0) as sink:
            for i in range(4 if folder == "a" else 7):
                sink.write({"__key__": f"{folder}{i}", "txt": "x"})
    beside = wdsx.WebDataset(str(tmp_path / "a" / "train-{000000..000001}.tar"))
    assert beside.reader.counts == [3, 1]
    mixed = wdsx.WebDataset(
        str(tmp_path / "a" / "train-{000000..000001}.tar")
        + "::"
        + str(tmp_path / "b" / "train-{000000..000002}.tar")
    )
    assert mixed.reader.counts is None  # b/ has its own, different, train-000000.tar
    assert mixed.urls[2] not in mixed.reader.settings.sha256 and mixed.urls[0] in mixed.reader.settings.sha256


def test_counts_follow_select_files(tmp_path):
    import wdsx
    from wdsx.write.writer import ShardWriter

    with ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(6):
            sink.write({"__key__": f"k{i}", "txt": "x", **({"jpg": b"j"} if i % 2 else {})})
    urls = str(tmp_path / "s-000000.tar")
    assert wdsx.WebDataset(urls).reader.counts == [6]
    selected = wdsx.WebDataset(urls, select_files="*.jpg", counts="scan")
    assert selected.reader.counts == [3] == [sum(1 for _ in selected)]
    assert wdsx.WebDataset(urls, select_files="*.jpg").reader.counts is None


def _write_run(pattern: str, prefix: str, samples: int, maxcount: int, fail_after: int | None = None) -> None:
    """A ShardWriter run writing ``samples`` text samples keyed ``prefix####``; with
    ``fail_after``, the user's loop raises after that many writes (as a crash would)."""
    import wdsx

    try:
        with wdsx.ShardWriter(pattern, maxcount=maxcount, verbose=0) as writer:
            for i in range(samples):
                writer.write({"__key__": f"{prefix}{i:04d}", "txt": prefix})
                if fail_after is not None and i + 1 == fail_after:
                    raise RuntimeError("the user's loop failed")
    except RuntimeError:
        pass


def _keys_in(path: str) -> list[str]:
    """The sample keys of a tar file as Python's tarfile reads them (one .txt per sample)."""
    with tarfile.open(path) as archive:
        return [member.name.rsplit(".", 1)[0] for member in archive.getmembers()]


def test_a_failed_rerun_leaves_no_manifest_of_the_earlier_run(tmp_path):
    import wdsx

    pattern = str(tmp_path / "part-%06d.tar")
    _write_run(pattern, "old", 30, maxcount=10)
    assert (tmp_path / "part.manifest.json").exists()
    _write_run(pattern, "new", 40, maxcount=25, fail_after=31)
    assert not (tmp_path / "part.manifest.json").exists()
    shards = sorted(str(path) for path in tmp_path.glob("part-*.tar"))
    expected = [key for shard in shards for key in _keys_in(shard)]
    read = [sample["__key__"] for sample in wdsx.WebDataset(shards, shardshuffle=False)]
    assert read == expected and len(read) == 25 + 20


def test_a_shard_with_more_samples_than_its_manifest_says_is_refused(tmp_path):
    import wdsx

    pattern = str(tmp_path / "part-%06d.tar")
    _write_run(pattern, "old", 30, maxcount=10)
    manifest = (tmp_path / "part.manifest.json").read_bytes()
    _write_run(pattern, "new", 25, maxcount=25)  # shard 0 rewritten with 25 samples
    (tmp_path / "part.manifest.json").write_bytes(manifest)  # the earlier run's manifest, put back
    shard = str(tmp_path / "part-000000.tar")
    with tarfile.open(shard) as archive:
        eleventh = archive.getmembers()[10].offset
    with pytest.raises(ShardError) as raised:
        list(wdsx.WebDataset(str(tmp_path / "part-{000000..000002}.tar"), shardshuffle=False))
    assert raised.value.url == shard and raised.value.offset == eleventh
    assert "more than 10 samples" in str(raised.value)


def test_a_manifest_entry_without_its_count_is_named(tmp_path):
    path = tmp_path / "s.manifest.json"
    path.write_text(json.dumps({"format": "wdsx-manifest", "version": 1, "shards": [{"name": "s-0.tar"}]}))
    with pytest.raises(ValueError, match=r"manifest\.json: not a manifest: an entry has no 'samples' field"):
        Manifest.load(str(path))


def test_a_glob_over_a_dataset_folder_names_its_shards_only(tmp_path):
    import wdsx
    from wdsx.sources.listing import list_shards

    _write_run(str(tmp_path / "part-%06d.tar"), "k", 4, maxcount=2)
    assert main(["index", str(tmp_path / "part-*.tar")]) == 0
    assert sorted(os.listdir(tmp_path)) == [
        "part-000000.tar",
        "part-000000.tar.idx",
        "part-000001.tar",
        "part-000001.tar.idx",
        "part.manifest.json",
    ]
    assert list_shards(str(tmp_path / "*")) == [str(tmp_path / f"part-00000{n}.tar") for n in (0, 1)]
    assert len(list(wdsx.WebDataset(str(tmp_path / "*"), shardshuffle=False))) == 4
