"""Timing helpers: medians over alternating runs, and measurements in fresh subprocesses."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def median_rate(run: Callable[[], int], repeats: int = 3) -> float:
    """Median items per second of ``run`` (which returns how many items it produced)."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        count = run()
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates)


def compare(runs: dict[str, Callable[[], int]], repeats: int = 3) -> dict[str, float]:
    """Median rate of each run, interleaving them so machine noise hits both alike."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            count = run()
            rates[name].append(count / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in rates.items()}


def in_subprocess(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it must print one JSON object last."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])
