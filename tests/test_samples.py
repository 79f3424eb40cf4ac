"""Grouping members into samples, against webdataset 1.0.2's own functions."""

from __future__ import annotations

import io
import re

import pytest
import webdataset.tariterators as wt
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.shards import tar_bytes
from wdsx.errors import ShardError
from wdsx.read.samples import POSITION, Cursor, group_members, is_meta, sample_starts, split_key
from wdsx.read.tar import iter_members, scan_headers

name_text = st.text(alphabet=st.sampled_from(list("ab.c/_\n-ÅZ9")), min_size=0, max_size=14)


@settings(max_examples=600, deadline=None)
@given(name_text)
def test_split_key_matches_webdataset(name):
    expected = wt.base_plus_ext(name)
    assert (split_key(name) or (None, None)) == expected


def webdataset_meta(name: str) -> bool:
    """webdataset's two skipping rules from tar_file_iterator."""
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return True
    return re.match(r"__[^/]*__($|/)", name) is not None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("_ab/.")), max_size=10))
def test_meta_rules_match_webdataset(name):
    assert is_meta(name) == webdataset_meta(name)


def webdataset_samples(data: bytes, **kw) -> list[dict]:
    files = wt.tar_file_iterator(io.BytesIO(data), **kw)
    return [dict(s) for s in wt.group_by_keys(dict(f, __url__="mem") for f in files)]


def wdsx_samples(data: bytes, **kw) -> list[dict]:
    samples = group_members(iter_members(io.BytesIO(data), "mem"), "mem", Cursor(0, 0), **kw)
    return [{k: v for k, v in s.items() if k != POSITION} for s in samples]


MEMBERS = [
    ("__meta__.json", b"{}"),
    ("a/x.jpg", b"1"),
    ("a/x.CLS", b"2"),
    ("a/x.seg.png", b"3"),
    ("a/y.jpg", b"4"),
    ("noext", b"5"),
    ("__dir__/z.txt", b"6"),
    ("b.v2/.hidden", b"7"),
    ("a/x.txt", b"8"),  # same key as earlier, not consecutive: a new sample
    ("c/2024.01.01.jpg", b"9"),
]


def test_grouping_matches_webdataset():
    data = tar_bytes(MEMBERS)
    assert wdsx_samples(data) == webdataset_samples(data)


def test_rename_and_select_match_webdataset():
    data = tar_bytes(MEMBERS)
    rename = lambda name: name.replace(".CLS", ".label")  # noqa: E731
    select = lambda name: not name.endswith(".png")  # noqa: E731
    expected = webdataset_samples(data, rename_files=rename, select_files=select)
    assert wdsx_samples(data, rename_files=rename, select_files=select) == expected


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["k1", "k2", "d/k3", "__m__", "k.4"]), st.sampled_from(["a", "b", "c.d"])),
        max_size=12,
    )
)
def test_random_groupings_match_webdataset(pairs):
    assert_groups_as_webdataset(tar_bytes([(f"{key}.{ext}", f"{key}{ext}".encode()) for key, ext in pairs]))


def assert_groups_as_webdataset(data: bytes) -> None:
    """wdsx groups the tar's members as webdataset does, or refuses the same duplicate."""
    try:
        expected = webdataset_samples(data)
    except ValueError:  # a duplicate extension inside one sample
        with pytest.raises(ShardError, match="duplicate"):
            wdsx_samples(data)
        return
    assert wdsx_samples(data) == expected


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(name_text.filter(bool), min_size=1, max_size=3))
def test_any_member_names_group_as_webdataset_groups_them(names):
    """Every name, whichever way the grouping splits it (its fast path or the general rule)."""
    assert_groups_as_webdataset(tar_bytes([(name, name.encode()) for name in names]))


def test_positions_point_at_each_samples_first_header():
    data = tar_bytes([(f"k{i}.{ext}", bytes([i])) for i in range(5) for ext in ("a", "b")])
    samples = list(group_members(iter_members(io.BytesIO(data), "mem"), "mem", Cursor(0, 0)))
    stream = io.BytesIO(data)
    starts = list(sample_starts(scan_headers(stream.read, lambda n: stream.seek(n, 1), "mem")))
    assert [(s[POSITION][2], s[POSITION][1]) for s in samples] == starts
    for sample in samples:
        url, offset, ordinal, _ = sample[POSITION]
        stream = io.BytesIO(data)
        stream.seek(offset)
        again = next(group_members(iter_members(stream, url, offset), url, Cursor(offset, ordinal)))
        assert again == sample


def test_cursor_tracks_the_next_sample_and_stops():
    data = tar_bytes([(f"k{i}.{ext}", b"") for i in range(5) for ext in ("a", "b")])
    cursor = Cursor(0, 0)
    samples = group_members(iter_members(io.BytesIO(data), "mem"), "mem", cursor, stop=3)
    seen = []
    for sample in samples:
        seen.append((sample["__key__"], cursor.ordinal, cursor.done))
    assert seen == [("k0", 1, False), ("k1", 2, False), ("k2", 3, True)]
