"""The ``wdsx`` command on JSONL and ``.npy`` shards: info, ls, cat, index and verify, checked
against what json.loads and np.load say the files hold."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tests.fixtures.records import make_jsonl_shards, make_npy_shards, read_jsonl
from wdsx.commands import cli
from wdsx.read.index import index_url


def test_info_ls_and_cat_on_jsonl(tmp_path, capsys):
    data = make_jsonl_shards(str(tmp_path), [4, 3])
    assert cli.main(["info", *data.urls]) == 0
    out = capsys.readouterr().out
    assert f"{data.urls[0]}: 4 samples" in out and "total: 2 shards, 7 samples" in out
    assert "fields: json (7)" in out
    assert cli.main(["ls", data.urls[0]]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    content = open(data.urls[0], "rb").read()
    starts = [0] + [i + 1 for i, byte in enumerate(content[:-1]) if byte == ord("\n")]
    assert [(int(r[0]), int(r[1]), r[2]) for r in listed] == [
        (i, s, f"part-0000/{i}") for i, s in enumerate(starts)
    ]
    assert cli.main(["cat", data.urls[1], "part-0001/2", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == read_jsonl(data.urls[1])[2]


def test_info_and_ls_on_npy(tmp_path, capsys):
    data = make_npy_shards(str(tmp_path), [5, 2], (2, 3), "int16")
    assert cli.main(["info", *data.urls]) == 0
    out = capsys.readouterr().out
    assert f"{data.urls[0]}: 5 samples, 60 B, rows of int16 [2, 3]" in out and "fields: npy (7)" in out
    assert cli.main(["ls", data.urls[1]]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [r[:3] for r in listed] == [["0", "0", "feats-001/0"], ["1", "1", "feats-001/1"]]


def test_index_and_verify_jsonl_and_npy(tmp_path, capsys):
    jsonl = make_jsonl_shards(str(tmp_path / "j"), [6, 9])
    npy = make_npy_shards(str(tmp_path / "n"), [6, 9])
    for urls in (jsonl.urls, npy.urls):
        assert cli.main(["index", *urls]) == 0
        assert cli.main(["verify", *urls]) == 0
    out = capsys.readouterr().out
    assert "offset indexes: 2 written" in out and "2 of 2 shards ok" in out
    assert all(os.path.exists(index_url(url)) for url in jsonl.urls)
    assert not any(os.path.exists(index_url(url)) for url in npy.urls)


def test_verify_finds_a_bad_line_and_a_truncated_npy(tmp_path, capsys):
    path = str(tmp_path / "bad.jsonl")
    with open(path, "w") as stream:
        stream.write('{"a": 1}\n{"a": 2\n{"a": 3}\n')
    assert cli.main(["verify", path]) == 1
    assert "line 2 is not valid JSON" in capsys.readouterr().out
    cut = str(tmp_path / "cut.npy")
    np.save(cut, np.zeros((10, 4), np.float32))
    with open(cut, "rb+") as stream:
        stream.truncate(stream.seek(0, os.SEEK_END) - 8)
    assert cli.main(["verify", cut]) == 1
    assert "shorter than its header says" in capsys.readouterr().out


def test_index_refuses_a_bad_line_and_a_truncated_npy_and_writes_no_manifest(tmp_path, capsys):
    """As readers would fail on them, and as ``index`` refuses a truncated tar: the error
    names the line (json.loads fails on it) and the bytes missing (np.load fails too)."""
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"a":1}\n{bad\n')
    with pytest.raises(ValueError):
        json.loads(b"{bad")
    assert cli.main(["index", str(bad)]) == 1
    assert "line 2 is not valid JSON" in capsys.readouterr().err
    cut = tmp_path / "f-000.npy"
    np.save(cut, np.zeros((10, 4), np.float32))
    cut.write_bytes(cut.read_bytes()[:-7])
    with pytest.raises(ValueError):
        np.load(cut)
    assert cli.main(["index", str(cut)]) == 1
    assert "shorter than its header says: it ends after 153 of the 160" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.manifest.json"))
