"""webdataset's own test suite, run on wdsx: what passes on webdataset passes on wdsx.

The suite ships in webdataset's source archive, which is downloaded from the package index
at test time (the version installed here, 1.0.2) and never copied into the repository. It
runs twice in fresh interpreters: as it is, on webdataset (the oracle), and under
``python -m wdsx.as_webdataset``, where ``import webdataset`` gives wdsx. Every test that
passes on webdataset must pass on wdsx, except the ones listed below, each a difference
the manual's "Differences from webdataset" gives the reason for.

Left out: the suite's files that need its ``testdata/`` folder or a ``conftest.py`` the
archive does not contain, and the tests that reach the internet (this machine reaches only
the package index).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.clients.packages import IndexUnreachable, source_distribution

FILES = [
    "test_cache.py",
    "test_filters.py",
    "test_gopen.py",
    "test_handlers.py",
    "test_security.py",
    "test_shardlists.py",
    "test_shuffles.py",
    "test_utils.py",
    "test_writer.py",
]
ONLINE = "remote or missing_throws2 or safe_urls_still_work"
"""The tests that open URLs on the internet."""

DIFFERENCES = {
    "test_cache.py::test_url_to_cache_name_non_string_input": "a wrong argument type is a TypeError",
    "test_handlers.py::test_missing_throws": "a missing local shard is an error when the dataset is built",
    "test_security.py::TestEnforceSecurity::test_pickle_loads_allowed_when_security_disabled": (
        "secure by default: pickle is refused unless WDSX_ALLOW_PICKLE=1"
    ),
    "test_security.py::TestEnforceSecurity::test_autodecode_integration_with_security": (
        "secure by default: pickle is refused unless WDSX_ALLOW_PICKLE=1"
    ),
    "test_writer.py::test_writer3": "secure by default: its .pyd field is not unpickled",
}
"""Tests that pass on webdataset and fail on wdsx on purpose, with the difference each shows."""

pytestmark = pytest.mark.slow  # two pytest runs in fresh interpreters


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    try:
        archive = source_distribution(f"webdataset=={version('webdataset')}")
    except IndexUnreachable as error:
        pytest.fail(str(error))
    folder = tmp_path_factory.mktemp("upstream")
    with tarfile.open(archive) as opened:
        members = [member for member in opened.getmembers() if "/tests/" in member.name]
        opened.extractall(folder, members=members, filter="data")
    return next(folder.glob("*/tests"))


def outcomes(tests: Path, *launcher: str) -> dict[str, str]:
    """Each test's outcome (``PASSED``, ``FAILED``...) in one run of the suite's files."""
    command = [sys.executable, *launcher, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
    command += ["-p", "no:randomly", "-k", f"not ({ONLINE})", *FILES]
    done = subprocess.run(command, cwd=tests, capture_output=True, text=True, timeout=600)
    found = re.findall(r"^(PASSED|FAILED|ERROR) (\S+)", done.stdout, re.M)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    return {name: outcome for outcome, name in found}


def test_what_passes_on_webdataset_passes_on_wdsx(suite):
    theirs = outcomes(suite)
    ours = outcomes(suite, "-m", "wdsx.as_webdataset")
    passing = {name for name, outcome in theirs.items() if outcome == "PASSED"}
    assert len(passing) >= 80, theirs
    failing_on_wdsx = {name for name in passing if ours.get(name) != "PASSED"}
    assert failing_on_wdsx == set(DIFFERENCES)
