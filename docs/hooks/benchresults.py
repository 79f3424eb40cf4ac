"""The performance page's tables and plots, drawn from the dated result files ``make bench``
keeps in ``benchmarks/results/`` (``YYYY-MM-DD.json``). Nothing here holds a number: every
figure on the page comes from those files, so the page shows what was measured, when and on
what machine. The plots are plain SVG written here, so the docs need no plotting library."""

from __future__ import annotations

import glob
import html
import json
import os
import re
from dataclasses import dataclass

RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)x(?:\s*$|\s*\(|\s*/)")
"""wdsx's rate over webdataset's at the start of the ratio column: "2.52x", "2.52x (CPU per
sample ...)", "1.30x / 1.23x" (the first setting); not "1.13x the full-size decode", a ratio
between two wdsx settings."""

BAR_COLOUR = "#3f51b5"
LINE_COLOURS = ("#3f51b5", "#e91e63", "#009688", "#ff9800", "#795548", "#607d8b", "#9c27b0", "#8bc34a")


@dataclass(frozen=True)
class Run:
    """One ``make bench`` run: its date, commit, machine and table rows (dicts by column)."""

    date: str
    commit: str
    machine: dict
    rows: list[dict]


def load_runs(folder: str) -> list[Run]:
    """Every result file in ``folder``, oldest first."""
    runs = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as stream:
            record = json.load(stream)
        runs.append(Run(record["date"], record.get("commit", ""), record.get("machine", {}), record["rows"]))
    return runs


def speedup(row: dict) -> float | None:
    """wdsx's rate over webdataset's for a row that compares the two, else None."""
    if not row.get("webdataset") or "/s" not in row.get("wdsx", ""):
        return None
    match = RATIO.match(row.get("ratio", ""))
    return float(match.group(1)) if match else None


def cell(text: str) -> str:
    """A table cell: pipes escaped so a value cannot split its row."""
    return text.replace("|", "\\|")


COLUMNS = ("benchmark", "wdsx", "webdataset", "ratio", "target")
HEADINGS = {"peers": ("benchmark", "wdsx", "the other loader", "ratio", "target")}
"""Column headings of a section whose third column is not webdataset's figure."""


def table(run: Run) -> str:
    """The run's rows as Markdown tables, one per ``make bench`` section, in the rows' order."""
    sections: dict[str, list[dict]] = {}
    for row in run.rows:
        sections.setdefault(row.get("section", ""), []).append(row)
    tables = []
    for section, rows in sections.items():
        headings = HEADINGS.get(section, COLUMNS)
        lines = [f"#### {section}"] if section and len(sections) > 1 else []
        lines += ["| " + " | ".join(headings) + " |", "|" + "---|" * len(headings)]
        lines += ["| " + " | ".join(cell(row.get(column, "")) for column in COLUMNS) + " |" for row in rows]
        tables.append("\n".join(lines))
    return "\n\n".join(tables)


def machine_line(run: Run) -> str:
    """Where and when the run was measured, in one sentence."""
    machine = run.machine
    parts = [f"Measured on {run.date}"]
    if commits := commits_line(run):
        parts.append(commits)
    if machine:
        parts.append(
            f"on {machine.get('cpus', '?')} CPUs ({machine.get('processor', '?')}, "
            f"{machine.get('platform', '?')}), Python {machine.get('python', '?')}"
        )
    return " ".join(parts) + "."


def commits_line(run: Run) -> str:
    """At which commit the rows were measured: one, or each with its sections when the day's
    sections ran at different commits (rows without their own commit have the run's)."""
    sections: dict[str, list[str]] = {}
    for row in run.rows:
        names = sections.setdefault(row.get("commit") or run.commit, [])
        if (section := row.get("section", "")) and section not in names:
            names.append(section)
    sections.pop("", None)
    if len(sections) <= 1:
        return "".join(f"at commit `{commit}`" for commit in sections)
    return "at commits " + ", ".join(f"`{commit}` ({', '.join(names)})" for commit, names in sections.items())


def bar_chart(run: Run) -> str:
    """A horizontal bar per row that compares rates: wdsx's speed-up over webdataset, with 1x marked."""
    bars = [(row["benchmark"], ratio) for row in run.rows if (ratio := speedup(row)) is not None]
    if not bars:
        return ""
    label_width, bar_width, row_height, top = 330, 300, 24, 30
    largest = max(ratio for _, ratio in bars)
    scale = bar_width / max(largest, 1.0)
    height = top + row_height * len(bars) + 10
    width = label_width + bar_width + 70
    parts = [_svg_open(width, height, f"wdsx speed-up over webdataset, {run.date}")]
    heading = f"wdsx rate / webdataset rate ({run.date})"
    parts.append(_text(label_width, 16, heading, anchor="start", bold=True))
    for index, (name, ratio) in enumerate(bars):
        y = top + index * row_height
        parts.append(_text(label_width - 8, y + 16, _shorten(name, 48), anchor="end"))
        parts.append(
            f'<rect x="{label_width}" y="{y + 3}" width="{ratio * scale:.1f}" height="{row_height - 6}" '
            f'fill="{BAR_COLOUR}"><title>{html.escape(name)}: {ratio:g}x</title></rect>'
        )
        parts.append(_text(label_width + ratio * scale + 4, y + 16, f"{ratio:g}x", anchor="start"))
    one = label_width + scale
    parts.append(
        f'<line x1="{one:.1f}" y1="{top - 4}" x2="{one:.1f}" y2="{height - 6}" stroke="#e91e63" '
        'stroke-width="1.5" stroke-dasharray="4 3"/>'
    )
    parts.append(_text(one + 3, height - 2, "1x", anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)


def history_chart(runs: list[Run]) -> str:
    """wdsx's speed-up over webdataset per benchmark across runs; empty with fewer than two runs."""
    if len(runs) < 2:
        return ""
    series: dict[str, list[tuple[int, float]]] = {}
    for index, run in enumerate(runs):
        for row in run.rows:
            ratio = speedup(row)
            if ratio is not None:
                series.setdefault(row["benchmark"], []).append((index, ratio))
    series = {name: points for name, points in series.items() if len(points) > 1}
    if not series:
        return ""
    left, top, plot_width, plot_height = 50, 30, 520, 260
    largest = max(ratio for points in series.values() for _, ratio in points)
    step = plot_width / (len(runs) - 1)
    width, height = left + plot_width + 20, top + plot_height + 40 + 18 * len(series)

    def point(index: int, ratio: float) -> tuple[float, float]:
        return left + index * step, top + plot_height * (1 - ratio / largest)

    parts = [_svg_open(width, height, "wdsx speed-up over webdataset, run by run")]
    parts.append(_text(left, 16, "wdsx rate / webdataset rate, run by run", anchor="start", bold=True))
    parts.append(
        f'<rect x="{left}" y="{top}" width="{plot_width}" height="{plot_height}" fill="none" stroke="#ccc"/>'
    )
    parts.append(_text(left - 6, top + 10, f"{largest:g}x", anchor="end"))
    parts.append(_text(left - 6, top + plot_height, "0", anchor="end"))
    for index, run in enumerate(runs):
        x, _ = point(index, 0)
        # (the first and last dates end at the plot's edges, inside the picture)
        anchor = "start" if index == 0 else "end" if index == len(runs) - 1 else "middle"
        parts.append(_text(x, top + plot_height + 16, run.date, anchor=anchor))
    for number, (name, points) in enumerate(sorted(series.items())):
        colour = LINE_COLOURS[number % len(LINE_COLOURS)]
        # past the colours, the same colours again with dashes: no two lines look alike
        dashes = ' stroke-dasharray="6 4"' if number // len(LINE_COLOURS) % 2 else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in (point(i, r) for i, r in points))
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"{dashes}/>')
        legend_y = top + plot_height + 36 + 18 * number
        parts.append(
            f'<line x1="{left}" y1="{legend_y - 4}" x2="{left + 14}" y2="{legend_y - 4}" stroke="{colour}" '
            f'stroke-width="3"{dashes}/>'
        )
        parts.append(_text(left + 20, legend_y, _shorten(name, 80), anchor="start"))
    parts.append("</svg>")
    return "\n".join(parts)


def performance_section(folder: str) -> str:
    """The generated part of the performance page: the latest run's plot and table, the history."""
    runs = load_runs(folder)
    if not runs:
        return "No result files yet: run `make bench` and commit `benchmarks/results/`."
    latest = runs[-1]
    sections = [f"### Latest run: {latest.date}", machine_line(latest)]
    sections += [_figure(bar_chart(latest)), table(latest)]
    history = history_chart(runs)
    if history:
        sections += ["### Run by run", _figure(history)]
    earlier = ", ".join(run.date for run in runs[:-1])
    if earlier:
        sections.append(f"Earlier result files: {earlier} (in `benchmarks/results/`).")
    return "\n\n".join(section for section in sections if section)


def _figure(svg: str) -> str:
    """An SVG as a raw HTML block (a ``div``, so Markdown leaves it alone), or "" for none."""
    return f'<div class="bench-plot">\n{svg}\n</div>' if svg else ""


def _svg_open(width: int, height: int, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="100%" style="max-width: {width}px" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">'
        f"<title>{html.escape(title)}</title>"
    )


def _text(x: float, y: float, text: str, anchor: str, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{weight}>{html.escape(text)}</text>'


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
