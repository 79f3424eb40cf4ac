"""The reference pages and the generated parts of the site say what the code does.

* real checkpoints (a dataset's, a loader's, a gathered one, and the version-2 ones of
  tests/fixtures/state_v2.json) validate against the published JSON schema, and their digest
  is what the checkpoint format page says it is, recomputed here from its description;
* the performance page's tables and plots carry the rows of the result files, and every
  committed result file has the shape the page reads;
* the command line page holds every subcommand's help.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

import pytest

import wdsx
from wdsx.commands import cli

jsonschema = pytest.importorskip("jsonschema")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "docs", "hooks"))

import benchresults  # noqa: E402
import generate  # noqa: E402

SCHEMA_PATH = os.path.join(ROOT, "docs", "reference", "checkpoint.schema.json")
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def schema():
    with open(SCHEMA_PATH) as stream:
        return json.load(stream)


def shards(tmp_path, count=3, per_shard=20):
    urls = []
    for number in range(count):
        url = str(tmp_path / f"part-{number:06d}.tar")
        with wdsx.TarWriter(url) as sink:
            for index in range(per_shard):
                sink.write({"__key__": f"s{number}-{index:03d}", "txt": f"sample {index}"})
        urls.append(url)
    return urls


def dataset_state(urls):
    dataset = wdsx.WebDataset(urls, shardshuffle=True).shuffle(10).to_tuple("__key__").batched(4)
    batches = iter(dataset)
    for _ in range(3):
        next(batches)
    return dataset.state_dict()


def loader_state(urls):
    loader = wdsx.WebLoader(wdsx.WebDataset(urls).shuffle(10).batched(4), batch_size=None, num_workers=0)
    batches = iter(loader)
    next(batches)
    return loader.state_dict()


def test_real_checkpoints_validate_against_the_schema(tmp_path, schema):
    urls = shards(tmp_path)
    for state in (dataset_state(urls), loader_state(urls)):
        jsonschema.validate(json.loads(json.dumps(state)), schema)
    loader = wdsx.WebLoader(wdsx.WebDataset(urls).batched(4), batch_size=None, num_workers=0)
    jsonschema.validate(wdsx.gather_loader_state(loader), schema)


def test_version_2_checkpoints_validate_against_the_schema(schema):
    with open(os.path.join(ROOT, "tests", "fixtures", "state_v2.json")) as stream:
        cases = json.load(stream)["cases"]
    for case in cases.values():
        assert case["state"]["version"] == 2
        jsonschema.validate(case["state"], schema)


def test_the_schema_refuses_what_loading_refuses(tmp_path, schema):
    state = dataset_state(shards(tmp_path))
    for broken in ({**state, "format": "other"}, {**state, "topology": [0]}, {**state, "epoch": -1}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, schema)


def test_the_digest_is_the_documented_hash(tmp_path):
    state = dataset_state(shards(tmp_path))
    body = {key: value for key, value in state.items() if key != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert state["digest"] == "sha256:" + hashlib.sha256(canonical.encode("ascii")).hexdigest()[:32]


def write_run(folder, date, rows):
    record = {"date": date, "commit": "abc1234", "machine": {"cpus": 2}, "rows": rows}
    with open(os.path.join(folder, f"{date}.json"), "w") as stream:
        json.dump(record, stream)


COLUMNS = ("benchmark", "wdsx", "webdataset", "ratio", "target")
ROWS = [
    dict(zip(COLUMNS, row))
    for row in (
        ("raw, tiny", "200 /s", "20 /s", "10.00x", ">= 10x"),
        ("decode", "30 /s", "12 /s", "2.50x (CPU less)", ""),
        ("peak RSS", "40 MB", "200 MB", "0.20x", "<= 1x"),
        ("state size", "11 B", "no state", "", "small"),
        ("scaled decoding", "31 /s", "12 /s", "1.03x the full-size decode", ""),
    )
]


def bars(svg_text):
    """(name, width) of every bar in an SVG chart."""
    root = ElementTree.fromstring(svg_text)
    return [
        (rect.find(f"{SVG}title").text.rsplit(":", 1)[0], float(rect.get("width")))
        for rect in root.iter(f"{SVG}rect")
        if rect.find(f"{SVG}title") is not None
    ]


def test_the_performance_section_shows_every_row_and_a_bar_per_rate_comparison(tmp_path):
    write_run(tmp_path, "2026-01-02", ROWS)
    page = benchresults.performance_section(str(tmp_path))
    table_rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table_rows] == [
        list(row.values()) for row in ROWS
    ]
    svg = re.search(r"<svg.*?</svg>", page, re.S).group(0)
    drawn = bars(svg)
    assert [name for name, _ in drawn] == ["raw, tiny", "decode"]  # wdsx over webdataset only
    assert drawn[0][1] / drawn[1][1] == pytest.approx(10.0 / 2.5, rel=1e-3)


def test_a_second_run_adds_a_line_per_benchmark(tmp_path):
    write_run(tmp_path, "2026-01-02", ROWS)
    write_run(tmp_path, "2026-01-09", [{**ROWS[0], "ratio": "11.00x"}, ROWS[1]])
    page = benchresults.performance_section(str(tmp_path))
    assert "Latest run: 2026-01-09" in page and "2026-01-02" in page
    charts = re.findall(r"<svg.*?</svg>", page, re.S)
    assert len(charts) == 2
    lines = ElementTree.fromstring(charts[1]).findall(f"{SVG}polyline")
    assert len(lines) == 2 and all(len(line.get("points").split()) == 2 for line in lines)


def test_committed_result_files_have_the_shape_the_page_reads():
    paths = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json")))
    for path in paths:
        with open(path) as stream:
            record = json.load(stream)
        assert os.path.basename(path) == f"{record['date']}.json"
        # each row also names the `make bench` section that measured it (run.py --only keeps
        # the other sections' rows of the same day by it), and may name its commit
        extra = {"section", "commit"}
        assert record["rows"] and all(set(row) - extra == set(COLUMNS) for row in record["rows"])
        assert all(isinstance(row.get("section", ""), str) for row in record["rows"])
        assert all(isinstance(row.get("commit", ""), str) for row in record["rows"])


def test_sections_measured_at_other_commits_are_named_with_their_commits(tmp_path):
    rows = [
        {**ROWS[0], "section": "read", "commit": "1111111"},
        {**ROWS[1], "section": "loader", "commit": "2222222"},
        {**ROWS[2], "section": "loader", "commit": "2222222"},
        {**ROWS[3], "section": "formats"},  # an older row without its own: the run's commit
    ]
    write_run(tmp_path, "2026-01-02", rows)
    page = benchresults.performance_section(str(tmp_path))
    assert "at commits `1111111` (read), `2222222` (loader), `abc1234` (formats)" in page
    write_run(tmp_path, "2026-01-02", ROWS)
    assert "at commit `abc1234` on 2 CPUs" in benchresults.performance_section(str(tmp_path))


def test_the_command_line_page_holds_every_subcommand():
    page = generate.cli_section()
    for name in cli.build_parser()._subparsers._group_actions[0].choices:
        assert f"## wdsx {name}\n" in page
    assert page.count("usage: wdsx") == 1 + len(cli.COMMANDS)


def test_docstring_roles_show_as_plain_code():
    html = "see :class:<code>~wdsx.state.position.Position</code> and :mod:<code>wdsx.stages.plan</code>"
    assert generate.plain_roles(html) == "see <code>Position</code> and <code>wdsx.stages.plan</code>"


def test_each_section_has_its_own_table_and_the_peers_table_names_its_column(tmp_path):
    rows = [{**ROWS[0], "section": "read"}, {**ROWS[1], "section": "peers"}, {**ROWS[2], "section": "read"}]
    write_run(tmp_path, "2026-01-02", rows)
    page = benchresults.performance_section(str(tmp_path))
    tables = {
        block.splitlines()[0]: [line for line in block.splitlines()[1:] if line.startswith("| ")]
        for block in page.split("\n\n")
        if block.startswith("#### ")
    }
    assert list(tables) == ["#### read", "#### peers"]
    assert "the other loader" in tables["#### peers"][0] and "webdataset" in tables["#### read"][0]
    assert [line.split(" | ")[0].strip("| ") for line in tables["#### read"][1:]] == [
        ROWS[0]["benchmark"],
        ROWS[2]["benchmark"],
    ]
