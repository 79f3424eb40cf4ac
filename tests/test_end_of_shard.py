"""The end-of-shard marker of ``tar_file_expander``: grouping code written for webdataset 0.2
(reading ``"fname"`` and ``"data"`` from every item) and for webdataset 1.0 (ending a sample
at ``{}``) both get from wdsx the samples they get on their own webdataset version.

Both grouping functions below are written here, the first as training code pinned to
webdataset 0.2.86 carries it, the second as webdataset 1.0.2's ``group_by_keys`` behaves. Each
runs unchanged over the members of the same shards, once with wdsx's ``tariterators`` and once
with the webdataset version it was written for (0.2.86 in a subprocess).
"""

from __future__ import annotations

import pickle

import pytest
import webdataset

from tests.fixtures.releases import run_with_release
from tests.fixtures.shards import write_tar
from wdsx import tariterators
from wdsx.core.sampleseed import EPOCH_SEED
from wdsx.read.members import END_OF_SHARD
from wdsx.read.samples import POSITION

GROUPING = """
def group_like_0_2(items, keys):
    # every item is a member: a repeated field starts a new sample
    current = None
    for item in items:
        name, value = item["fname"], item["data"]
        key, field = keys(name)
        if key is None:
            continue
        field = field.lower()
        if current is None or key != current["__key__"] or field in current:
            if current:
                yield current
            current = {"__key__": key, "__url__": item["__url__"]}
        current[field] = value
    if current:
        yield current


def group_like_1_0(items, keys):
    # an empty dict ends the shard, and with it the sample
    current = None
    for item in items:
        if item == {}:
            if current:
                yield current
            current = None
            continue
        key, field = keys(item["fname"])
        if key is None:
            continue
        field = field.lower()
        if current is None or key != current["__key__"]:
            if current:
                yield current
            current = {"__key__": key, "__url__": item["__url__"]}
        if field in current:
            raise ValueError(f"duplicate field {field} in {key}")
        current[field] = item["data"]
    if current:
        yield current


def grouped(tariterators, urls, group):
    opened = tariterators.url_opener(iter([{"url": url} for url in urls]))
    members = tariterators.tar_file_expander(opened)
    samples = globals()[group](members, tariterators.base_plus_ext)
    return [sorted((k, v if isinstance(v, str) else v.decode()) for k, v in s.items()) for s in samples]
"""


def grouped_by(library_tariterators, urls: list[str], group: str) -> list:
    namespace: dict = {}
    exec(GROUPING, namespace)
    return namespace["grouped"](library_tariterators, urls, group)


@pytest.fixture
def shard_urls(tmp_path) -> list[str]:
    """Two shards where the first one's last key is the second one's first key (where the two
    generations of grouping part ways), with a member that has no extension."""
    first = [
        ("a/1.txt", b"a1"),
        ("a/1.cls", b"1"),
        ("README", b"no key"),
        ("a/2.txt", b"a2"),
        ("same.txt", b"s1"),
    ]
    second = [("same.cls", b"7"), ("same.txt", b"s2"), ("b/1.TXT", b"b1"), ("b/1.cls", b"3")]
    return [write_tar(str(tmp_path / "first.tar"), first), write_tar(str(tmp_path / "second.tar"), second)]


@pytest.mark.slow  # installs webdataset 0.2.86 once, and imports it in a subprocess
def test_grouping_written_for_0_2_gets_what_webdataset_0_2_86_gives(shard_urls):
    expected = run_with_release(
        "0.2.86",
        GROUPING + "\nfrom webdataset import tariterators\n"
        "result = grouped(tariterators, INPUTS['urls'], 'group_like_0_2')",
        urls=shard_urls,
    )
    ours = grouped_by(tariterators, shard_urls, "group_like_0_2")
    assert [[list(pair) for pair in sample] for sample in ours] == expected
    # the shards' edge case: 0.2-era grouping joins the first shard's last sample with the
    # second shard's first member, as it did on webdataset 0.2.86
    assert ["cls", "7"] in expected[2] and ["txt", "s1"] in expected[2]


def test_the_same_grouping_fails_on_webdataset_1_0_2(shard_urls):
    with pytest.raises(KeyError, match="fname"):
        grouped_by(webdataset.tariterators, shard_urls, "group_like_0_2")


def test_grouping_written_for_1_0_gets_what_webdataset_1_0_2_gives(shard_urls):
    expected = grouped_by(webdataset.tariterators, shard_urls, "group_like_1_0")
    assert grouped_by(tariterators, shard_urls, "group_like_1_0") == expected
    samples = tariterators.tarfile_samples(iter([{"url": url} for url in shard_urls]))
    theirs = webdataset.tariterators.tarfile_samples(iter([{"url": url} for url in shard_urls]))
    ours = [{k: v for k, v in sample.items() if k not in (POSITION, EPOCH_SEED)} for sample in samples]
    assert ours == list(theirs)


def test_the_marker_is_an_empty_dict_that_old_code_can_read():
    marker = END_OF_SHARD
    assert marker == {} and not marker and len(marker) == 0 and isinstance(marker, dict)
    assert list(marker) == [] and "fname" not in marker and repr(marker) == "{}"
    assert (marker["fname"], marker["data"]) == ("", b"")
    assert tariterators.base_plus_ext(marker["fname"]) == (None, None)
    assert webdataset.tariterators.base_plus_ext(marker["fname"]) == (None, None)
    with pytest.raises(KeyError):
        marker["__url__"]  # noqa: B018
    assert pickle.loads(pickle.dumps(marker)) == {}


@pytest.mark.parametrize("eof_value", [None, {}, {"end": True}])
def test_eof_value_is_what_ends_each_shard(shard_urls, eof_value):
    def items(library):
        opened = library.url_opener(iter([{"url": url} for url in shard_urls]))
        return [
            item if item is eof_value else (item["fname"], item["data"], item["__url__"])
            for item in library.tar_file_expander(opened, eof_value=eof_value)
        ]

    assert items(tariterators) == items(webdataset.tariterators)


def test_the_default_marker_ends_each_shard(shard_urls):
    opened = tariterators.url_opener(iter([{"url": url} for url in shard_urls]))
    ends = [i for i, item in enumerate(tariterators.tar_file_expander(opened)) if item is END_OF_SHARD]
    assert ends == [5, 10]
