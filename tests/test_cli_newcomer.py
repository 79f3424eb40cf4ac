"""The ``wdsx`` command as a newcomer meets it: what went wrong is said plainly, by path."""

from __future__ import annotations

import io
import warnings

import numpy as np
import PIL.Image

from tests.fixtures.shards import write_tar
from wdsx.commands import cli
from wdsx.write.writer import ShardWriter


def png(size: int = 16) -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.zeros((size, size), np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_convert_with_nothing_readable_fails_and_names_each_file(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.jpg").write_bytes(b"not an image")
    (src / "cat" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    assert cli.main(["convert", str(src), str(tmp_path / "out" / "x")]) == 1
    err = capsys.readouterr().err
    assert "no image could be read" in err
    assert f"skipped {src / 'cat' / 'a.jpg'}:" in err and f"skipped {src / 'cat' / 'b.png'}:" in err
    assert "BytesIO" not in err and "not an image format Pillow recognises" in err
    assert not (tmp_path / "out" / "x.manifest.json").exists()


def test_convert_gathers_decoder_warnings_into_its_report(tmp_path, capsys, monkeypatch):
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "big.png").write_bytes(png(16))
    (src / "cat" / "small.png").write_bytes(png(4))
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 200)  # 16x16 = 256 pixels: a bomb warning
    with warnings.catch_warnings(record=True) as stray:
        warnings.simplefilter("always")
        assert cli.main(["convert", str(src), str(tmp_path / "out" / "x")]) == 0
    captured = capsys.readouterr()
    assert f"warning {src / 'cat' / 'big.png'}: DecompressionBombWarning" in captured.err
    assert "small.png" not in captured.err
    assert "2 images, 0 skipped, 1 warnings" in captured.out
    assert not [w for w in stray if issubclass(w.category, PIL.Image.DecompressionBombWarning)]


def test_ls_has_column_headers(tmp_path, capsys):
    path = write_tar(str(tmp_path / "x.tar"), [("a.txt", b"1"), ("a.cls", b"2")])
    assert cli.main(["ls", path]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"# {path}"
    assert lines[1].split() == ["#", "ordinal", "offset", "key", "fields", "(name:bytes)"]
    assert lines[2].split() == ["0", "0", "a", "txt:1", "cls:1"]


def test_verify_says_what_it_checked_against_what(tmp_path, capsys):
    pattern = str(tmp_path / "set-%06d.tar")
    with ShardWriter(pattern, maxcount=2, verbose=0) as sink:
        for i in range(3):
            sink.write({"__key__": f"k{i}", "png": png(), "cls": i})
    assert cli.main(["verify", str(tmp_path / "set-*.tar")]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("2 of 2 shards ok:")
    assert f"compared with the manifest {tmp_path / 'set.manifest.json'}" in summary
    assert "SHA-256" in summary and "3 images decoded, 0 of them failed" in summary
    assert "0 offset indexes compared" in summary  # ShardWriter writes none
    broken = write_tar(str(tmp_path / "broken.tar"), [("a.png", png()), ("b.png", b"not a png")])
    assert cli.main(["verify", broken]) == 1
    assert "2 images decoded, 1 of them failed" in capsys.readouterr().out.splitlines()[-1]
    lone = write_tar(str(tmp_path / "lone.tar"), [("a.txt", b"1")])
    assert cli.main(["verify", lone, "--no-images"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert f"no manifest at {tmp_path / 'lone.manifest.json'}" in summary and "not decoded" in summary
