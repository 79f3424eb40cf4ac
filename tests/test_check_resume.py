"""``wdsx.check_resume`` and ``wdsx check-resume``: identity for pipelines that resume exactly,
the first differing batch, sample and stage for those that do not. The oracles are plain
iterations of the same loaders."""

from __future__ import annotations

import itertools
import random

import pytest

import wdsx
from wdsx.commands import cli


def keyed(pattern: str, noise=None, workers: int = 0, **loader_args) -> wdsx.WebLoader:
    """A shuffled, batched loader whose items carry keys and a per-sample number."""
    draw = noise or (lambda sample: wdsx.sample_rng(sample).random())
    dataset = (
        wdsx.WebDataset(pattern, shardshuffle=True)
        .shuffle(10)
        .map(lambda sample: {**sample, "noise": draw(sample)})
        .to_tuple("__key__", "noise")
        .batched(4)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers, **loader_args)


def test_a_correct_pipeline_resumes_identically_at_every_cut(shards):
    report = wdsx.check_resume(lambda: keyed(shards.pattern), cuts=3, epochs=2)
    assert report.identical, str(report)
    assert report.batches == 2 * len(shards.keys) // 4
    assert report.batches // 2 in report.cuts  # the epoch boundary is always tried
    assert len(report.runs) == 2 + len(report.cuts)  # second run, one per cut, all cuts in turn
    assert str(report).startswith("resumes exactly")


@pytest.mark.slow
def test_workers_persistent_workers_epoch_boundaries_and_repeated_resumes(shards):
    half = len(shards.keys) // 4 // 2
    report = wdsx.check_resume(
        lambda: keyed(shards.pattern, workers=2, persistent_workers=True),
        cuts=[3, half, half + 1, 2 * half + 3],  # the epoch's last batch, the next epoch's first
        epochs=2,
    )
    assert report.identical, str(report)
    assert report.runs[-1] == f"resumed after batches 3, {half}, {half + 1}, {2 * half + 3} in turn"


def test_an_unseeded_random_map_is_caught_at_its_first_batch(shards):
    make = lambda: keyed(shards.pattern, noise=lambda sample: random.random())  # noqa: E731
    first, second = list(make()), list(make())
    oracle = next(i for i, (a, b) in enumerate(zip(first, second)) if list(a[1]) != list(b[1]))
    report = wdsx.check_resume(make)
    assert not report.identical
    difference = report.difference
    assert difference.run == "second uninterrupted run" and difference.batch == oracle == 0
    assert difference.key == first[0][0][0]  # the first sample of that batch
    assert difference.stage is not None and "map" in difference.stage
    assert f"batch {oracle} differs" in str(report)


def test_a_map_with_hidden_state_is_caught_right_after_the_cut(shards):
    def make() -> wdsx.WebLoader:
        counter = itertools.count()  # starts again in every new process: not resumable
        return keyed(shards.pattern, noise=lambda sample: next(counter))

    reference = list(make())
    report = wdsx.check_resume(make, cuts=[5])
    assert report.difference is not None
    assert (report.difference.run, report.difference.batch) == ("resumed after batch 5", 5)
    assert report.difference.key == reference[5][0][0]
    assert report.difference.position is not None
    assert "map" in report.difference.stage


def test_the_command_runs_a_function_from_a_file(shards, tmp_path, capsys):
    script = tmp_path / "pipeline.py"
    script.write_text(
        "import random\n"
        "from tests.test_check_resume import keyed\n"
        f"def good():\n    return keyed({shards.pattern!r})\n"
        f"def bad():\n    return keyed({shards.pattern!r}, noise=lambda sample: random.random())\n"
    )
    assert cli.main(["check-resume", f"{script}:good", "--cuts", "2,7"]) == 0
    assert "resumes exactly" in capsys.readouterr().out
    assert cli.main(["check-resume", f"{script}:bad"]) == 1
    assert "NOT exactly resumable" in capsys.readouterr().out
    assert cli.main(["check-resume", f"{script}:missing"]) == 1
    assert "no function 'missing'" in capsys.readouterr().err
