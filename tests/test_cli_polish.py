"""What a person looks at: the preview of transparent images and its captions, ``wdsx verify``'s
memory, progress and decoder warnings, output into a pipe closed early, the step-time spread
of ``wdsx bench``, and the repr of pipelines and loaders."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import warnings

import numpy as np
import PIL.Image
import pytest
from PIL import ImageDraw, ImageFont

import wdsx
from tests.fixtures.peak import REPORT_PEAK, reported_peak
from wdsx.commands import cli
from wdsx.commands.preview import CAPTION_LINES, LINE, MARGIN, image_box, tile_size


def encoded(image: PIL.Image.Image, format: str = "PNG") -> bytes:
    out = io.BytesIO()
    image.save(out, format=format)
    return out.getvalue()


def clip_art(side: int = 32) -> np.ndarray:
    """An RGBA drawing on a transparent background: an opaque red disc, a half-transparent
    blue bar, and (as clip art has) colour values left black where alpha is 0."""
    pixels = np.zeros((side, side, 4), dtype=np.uint8)
    rows, columns = np.indices((side, side))
    disc = (rows - side / 2) ** 2 + (columns - side / 2) ** 2 < (side / 3) ** 2
    pixels[disc] = (220, 20, 20, 255)
    pixels[: side // 8, :] = (20, 20, 220, 128)
    return pixels


def sheet_of(tmp_path, samples: list[dict], size: int) -> np.ndarray:
    path = str(tmp_path / "shard.tar")
    with wdsx.TarWriter(path) as sink:
        for sample in samples:
            sink.write(sample)
    output = str(tmp_path / "sheet.png")
    assert cli.main(["preview", path, "-o", output, "--columns", str(len(samples)), "--size", str(size)]) == 0
    return np.asarray(PIL.Image.open(output).convert("RGB"))


@pytest.mark.parametrize("kind", ["RGBA", "palette"])
def test_preview_shows_transparent_images_over_a_light_background(tmp_path, kind):
    art = clip_art()
    image = PIL.Image.fromarray(art)
    if kind == "palette":  # a GIF-style image: one palette entry marked transparent
        image = image.convert("RGB").quantize(colors=8)
        transparent_index = image.getpixel((0, 31))
        image.info["transparency"] = transparent_index
        art = np.asarray(image.convert("RGBA"))
    sheet = sheet_of(tmp_path, [{"__key__": "art", "png": encoded(image)}], 64)
    left, top = image_box(0, 1, 64)
    tile = sheet[top : top + 64, left : left + 64].astype(int)
    alpha = np.kron(art[..., 3], np.ones((2, 2), dtype=np.uint8))  # 32 x 32 shown twice as large
    colour = np.kron(art[..., :3], np.ones((2, 2, 1), dtype=np.uint8)).astype(int)
    clear, solid = alpha == 0, alpha == 255
    assert clear.any() and solid.any()
    assert tile[clear].min() >= 190, "no transparent pixel shows black"
    assert np.abs(tile[solid] - colour[solid]).max() <= 1, "opaque pixels keep their colour"
    assert (tile.sum(axis=-1) > 90).all(), "no black anywhere in the tile"


def test_preview_captions_say_which_field_each_tile_shows(tmp_path):
    pixels = np.full((16, 16, 3), 90, dtype=np.uint8)
    samples = [
        {"__key__": "a", "txt": "x", "seg.png": encoded(PIL.Image.fromarray(pixels))},
        {"__key__": "b", "txt": "only text"},
    ]
    size = 96
    sheet = sheet_of(tmp_path, samples, size)
    width, height = tile_size(size)
    assert height == size + 3 * MARGIN + CAPTION_LINES * LINE
    font = ImageFont.load_default()
    for index, expected in enumerate(["image: seg.png", "text of the fields"]):
        left, top = image_box(index, 2, size)
        line_top = top + size + MARGIN + LINE  # the caption's second line
        drawn = sheet[line_top : line_top + LINE, left : left + size]
        oracle = PIL.Image.new("RGB", (size, LINE), "white")
        ImageDraw.Draw(oracle).text((0, 0), expected, fill="black", font=font)
        assert np.array_equal(drawn, np.asarray(oracle)), expected


def png_shard(path: str, count: int, side: int) -> None:
    """``count`` samples holding the same ``side`` x ``side`` RGB PNG (a smooth gradient:
    small to store, ``3 * side * side`` bytes each once decoded)."""
    ramp = np.linspace(0, 255, side, dtype=np.uint8)
    pixels = np.stack(np.broadcast_arrays(ramp[:, None], ramp[None, :], ramp[:, None]), axis=-1)
    data = encoded(PIL.Image.fromarray(np.ascontiguousarray(pixels)))
    with wdsx.TarWriter(path) as sink:
        for i in range(count):
            sink.write({"__key__": f"k{i:05d}", "png": data})


VERIFY = """
import sys
from wdsx.commands import cli
print("STATUS", cli.main(["verify", "--no-progress", *sys.argv[1:]]))
"""


def verify_peak(url: str) -> int:
    ran = subprocess.run(
        [sys.executable, "-c", REPORT_PEAK + textwrap.dedent(VERIFY), url], capture_output=True, text=True
    )
    assert "STATUS 0" in ran.stdout, ran.stdout + ran.stderr
    peak = reported_peak(ran.stdout)
    assert peak is not None, ran.stdout
    return peak


@pytest.mark.slow
def test_verify_memory_stays_bounded_however_many_images(tmp_path):
    """400 images of 1024 x 1024 decode to 1.2 GB in all; checking them costs about what
    checking one costs (the same run on a one-image shard is the baseline)."""
    one, many = str(tmp_path / "one.tar"), str(tmp_path / "many.tar")
    png_shard(one, 1, 1024)
    png_shard(many, 400, 1024)
    baseline, peak = verify_peak(one), verify_peak(many)
    assert peak - baseline < 32 << 20, (baseline >> 20, peak >> 20)
    assert peak < 300 << 20


def test_verify_gathers_decoder_warnings_into_its_report(tmp_path, capsys, monkeypatch):
    """Pillow warns of a possible decompression bomb for images over ``MAX_IMAGE_PIXELS``
    (and refuses those over twice it); with the limit at 100 pixels a 12 x 12 image warns."""
    monkeypatch.setattr(PIL.Image, "MAX_IMAGE_PIXELS", 100)
    data = encoded(PIL.Image.new("RGB", (12, 12), "green"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PIL.Image.open(io.BytesIO(data)).load()
    (pillows,) = [str(warning.message) for warning in caught]
    path = str(tmp_path / "warned.tar")
    with wdsx.TarWriter(path) as sink:
        for i in range(3):
            sink.write({"__key__": f"k{i}", "png": data})
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        assert cli.main(["verify", path]) == 0
    captured = capsys.readouterr()
    assert escaped == [] and captured.err == ""
    assert f"warning (3 images, first sample 'k0' field 'png'): {pillows}" in captured.out
    assert captured.out.strip().endswith("3 decoder warnings")


def test_verify_shows_progress_on_stderr_when_asked(tmp_path, capsys):
    path = str(tmp_path / "shard.tar")
    png_shard(path, 5, 8)
    assert cli.main(["verify", "--progress", path]) == 0
    captured = capsys.readouterr()
    assert "5" in captured.err and "sample" in captured.err
    assert captured.out.startswith(f"ok   {path}\n")
    assert cli.main(["verify", path]) == 0  # stderr is not a terminal here: no progress
    assert capsys.readouterr().err == ""


def test_the_progress_line_without_tqdm_keeps_its_own_control_sequences(tmp_path, capsys, monkeypatch):
    """Without tqdm the line is erased and rewritten with ESC [K, which reaches the terminal as
    it is, while the control characters of the text written (a shard's name) are escaped."""
    from wdsx.commands import common

    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setattr(common.Progress, "INTERVAL", 0)
    path = str(tmp_path / "sh\x1bard.tar")
    png_shard(path, 3, 8)
    assert cli.main(["verify", "--progress", path]) == 0
    err = capsys.readouterr().err
    assert err.count("\r\x1b[K") >= 3 and "sh\\x1bard.tar" in err and "sh\x1bard" not in err


@pytest.mark.slow
def test_output_into_a_pipe_closed_early_ends_quietly(tmp_path):
    path = str(tmp_path / "long.tar")
    with wdsx.TarWriter(path) as sink:
        for i in range(5000):  # far more listing than a pipe holds
            sink.write({"__key__": f"sample{i:06d}", "txt": "x"})
    with subprocess.Popen(
        [sys.executable, "-m", "wdsx.commands.cli", "ls", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=str(tmp_path),
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.readline()
        child.stdout.close()  # what `| head -1` does after its line
        errors = child.stderr.read()
        status = child.wait(timeout=60)
    assert first == f"# {path}\n".encode()
    assert errors == b""
    assert status == 141


def test_bench_prints_the_step_time_spread_in_milliseconds(tmp_path, capsys):
    path = str(tmp_path / "shard.tar")
    png_shard(path, 12, 8)
    assert cli.main(["bench", path, "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "^2" not in out and "²" not in out
    assert re.search(r"step time: mean \d+\.\d\d ms, standard deviation \d+\.\d\d ms", out), out


# --- repr -----------------------------------------------------------------------------------


def stage_names(text: str) -> list[str]:
    """The stage names of a pipeline's repr (the text before each part's parenthesis)."""
    return [part.split("(")[0] for part in text.split(" | ")]


@pytest.fixture
def three_shards(tmp_path) -> list[str]:
    urls = [str(tmp_path / f"part-{i}.tar") for i in range(3)]
    for url in urls:
        png_shard(url, 2, 4)
    return urls


def test_repr_of_a_webdataset_lists_its_stages(three_shards):
    dataset = (
        wdsx.WebDataset(three_shards, shardshuffle=True)
        .shuffle(1000)
        .decode("rgb")
        .to_tuple("png", "__key__")
        .batched(16)
    )
    text = repr(dataset)
    assert stage_names(text) == ["WebDataset", "shuffle", "decode", "to_tuple", "batched"]
    first, shuffled, decoded, tupled, batched = text.split(" | ")
    assert "3 shards" in first and three_shards[0] in first and "shuffled" in first
    assert "1000" in shuffled and "rgb" in decoded and "png" in tupled and "16" in batched
    assert repr(dataset.with_epoch(50)).endswith(" | with_epoch(50)")


def test_repr_of_pipelines_built_from_functions_and_iterables(three_shards):
    pipeline = wdsx.DataPipeline(
        wdsx.SimpleShardList(three_shards),
        wdsx.split_by_worker,
        wdsx.tarfile_to_samples(),
        wdsx.map(len),
    )
    assert stage_names(repr(pipeline)) == ["DataPipeline", "split_by_worker", "tarfile_to_samples", "map"]
    assert "3 shards" in repr(pipeline).split(" | ")[0]
    fluid = wdsx.FluidWrapper([1, 2, 3]).map(str).batched(2)
    assert stage_names(repr(fluid)) == ["FluidWrapper", "map", "batched"]
    assert repr(wdsx.DataPipeline()) == "DataPipeline()"


def test_repr_of_a_mixture_and_a_loader(three_shards):
    pytest.importorskip("torch")
    first = wdsx.WebDataset(three_shards[:1], shardshuffle=False)
    second = wdsx.WebDataset(three_shards[1:], shardshuffle=False).shuffle(10)
    mixed = wdsx.Mix([first, second], [1, 3]).batched(4)
    text = repr(mixed)
    assert text.startswith(f"Mix([{first!r}, {second!r}], weights=[1.0, 3.0]") and text.endswith(
        "| batched(4, partial=True)"
    )
    loader = wdsx.WebLoader(mixed, batch_size=None, num_workers=2).unbatched()
    text = repr(loader)
    assert text.startswith(f"WebLoader({mixed!r}, batch_size=None, num_workers=2)")
    assert stage_names(text)[-1] == "unbatched"
    assert os.path.basename(three_shards[1]) in text


def one_line_error(capsys) -> str:
    """What the command printed on stderr, asserted to be one line and no traceback."""
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_check_resume_with_nothing_to_compare_fails(tmp_path, capsys, monkeypatch):
    from tests.fixtures.shards import make_shards

    data = make_shards(str(tmp_path / "shards"), [4, 4])
    (tmp_path / "builds.py").write_text(
        textwrap.dedent(
            f"""
            import wdsx

            def make_loader():
                return wdsx.WebDataset({data.urls!r}, shardshuffle=False).batched(2)

            def not_a_loader():
                return 42
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check-resume", "builds.py:make_loader", "--cuts", "100,200"]) == 1
    assert "nothing to compare: the run yields 4 batches" in one_line_error(capsys)
    assert cli.main(["check-resume", "builds.py:not_a_loader"]) == 1
    assert "returned 42, not a wdsx loader" in one_line_error(capsys)
    assert cli.main(["check-resume", "no_such_module:f"]) == 1
    assert "no module named 'no_such_module'" in one_line_error(capsys)
    assert cli.main(["check-resume", "builds.py:make_loader", "--cuts", "2,3,20"]) == 1
    assert "cuts after 20 fall outside the run of 4 batches" in one_line_error(capsys)
    assert cli.main(["check-resume", "builds.py:make_loader", "--cuts", "2"]) == 0


def test_an_unset_variable_in_a_pattern_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.delenv("WDS_NOT_SET_HERE", raising=False)
    assert cli.main(["info", "data/${NOT_SET_HERE}/s-000.tar"]) == 1
    assert "environment variable WDS_NOT_SET_HERE is not set" in one_line_error(capsys)


@pytest.mark.parametrize(
    "arguments",
    [
        ["preview", "x.tar", "--size", "0"],
        ["ls", "-n", "-1", "x.tar"],
        ["bench", "x.tar", "--batches", "0"],
        ["check-resume", "m:f", "--cuts", "2,0"],
        ["check-resume", "m:f", "--cuts", "abc"],
    ],
)
def test_counts_and_sizes_below_one_are_usage_errors(arguments, capsys):
    assert cli.main(arguments) == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err or "not a whole number" in err


def test_bench_weights_without_a_mixture_are_refused(capsys):
    assert cli.main(["bench", "x.tar", "--weights", "1,2"]) == 1
    assert "name the datasets to mix with --mix-with" in one_line_error(capsys)


def test_control_characters_in_names_reach_the_terminal_escaped(tmp_path, capsys):
    """A member name with a terminal escape (here one that would set the window's title) is
    listed with the escape written out, never as the raw control character."""
    name = "x\x1b]0;owned\x07.txt"
    path = tmp_path / "names.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo(name)
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    assert cli.main(["ls", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "x\\x1b]0;owned\\x07" in out
