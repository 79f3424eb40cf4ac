"""A bounded fuzzing run in the test suite (``make fuzz`` runs long campaigns): a few thousand
seeded inputs over every surface, and truncation at every offset of a shard, with no hang, no
foreign exception, no memory beyond the cap and no silent loss (see
:mod:`tests.fuzz.outcomes` for the classes, :mod:`tests.fuzz.surfaces` for the surfaces)."""

from __future__ import annotations

import tempfile

import pytest

from tests.fuzz import campaign, oracle, surfaces, tarbytes
from tests.fuzz.corpus import Base
from tests.fuzz.outcomes import FAILURES
from tests.fuzz.surfaces import tar as target

INPUTS = 2500
NEW_INPUTS = 1500


@pytest.mark.slow  # thousands of mutated shards
@pytest.mark.timeout(300)
def test_a_seeded_fuzz_run_finds_no_failure():
    summary = campaign.run_campaign(seed=7, count=INPUTS, workers=1, timeout=5.0, memory_mb=512)
    assert summary.inputs == INPUTS
    assert summary.failed == 0, summary.table()
    assert summary.outcomes["ok"] > 0 and summary.outcomes["error"] > 0  # the inputs do vary


@pytest.mark.slow  # JSONL, .npy, compressed members, a misbehaving HTTP server, tampered checkpoints
@pytest.mark.timeout(300)
def test_a_seeded_fuzz_run_over_the_other_surfaces_finds_no_failure():
    summary = campaign.run_campaign(
        seed=7, count=NEW_INPUTS, surfaces=surfaces.NEW, workers=1, timeout=5.0, memory_mb=512
    )
    assert summary.inputs == NEW_INPUTS
    assert summary.failed == 0, summary.table()
    assert set(summary.by_surface) == set(surfaces.NEW)
    assert sum(sum(counts.values()) for counts in summary.by_surface.values()) == NEW_INPUTS
    assert summary.outcomes["ok"] > 0 and summary.outcomes["error"] > 0


def truncated_everywhere(base: Base) -> list[str]:
    """The outcome class of the base shard cut at every offset (0 to its whole length)."""
    original = oracle.verdict(base.stored()).samples
    assert original
    stored = base.stored()
    classes = []
    with tempfile.TemporaryDirectory() as scratch:
        for cut in range(len(stored) + 1):
            item = target.Input(
                cut, base, ("truncate",), stored[:cut], 512 if cut % 2 else None, cut % 64 == 0
            )
            classes.append(target.classify(item, target.read_all_ways(item, scratch), original)[0])
    return classes


@pytest.mark.slow  # a shard cut at every offset
@pytest.mark.timeout(300)
@pytest.mark.parametrize("compression", [None, "gzip"])
def test_truncation_at_every_offset_is_an_error_unless_only_padding_is_lost(compression):
    members = [
        tarbytes.member(b"k%d.%s" % (i, ext), bytes([i]) * (150 * i + 7))
        for i in range(2)
        for ext in (b"txt", b"bin")
    ]
    tar = b"".join(members) + tarbytes.ZERO * 2
    classes = truncated_everywhere(Base("hand", tar, compression))
    assert not set(classes) & set(FAILURES)
    assert classes[-1] == "ok"
    readable = [cut for cut, kind in enumerate(classes) if kind != "error"]
    marker = len(tar) - 2 * tarbytes.BLOCK
    # a plain tar reads whole once its end-of-archive marker is complete; a gzip only whole
    assert readable == (
        list(range(marker + tarbytes.BLOCK, len(tar) + 1)) if compression is None else [len(classes) - 1]
    )
