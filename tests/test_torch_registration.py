"""wdsx's datasets are torch IterableDatasets, as webdataset's are (they subclass it), although
wdsx never imports torch itself: also a dataset built before the program imports torch. The
oracle is webdataset's own dataset in torch's DataLoader."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import webdataset
from torch.utils.data import DataLoader

from tests.fixtures.shards import make_shards

LATE_IMPORT = textwrap.dedent(
    """
    import json, sys
    import wdsx

    dataset = wdsx.WebDataset(sys.argv[1:], shardshuffle=False).to_tuple("__key__", "cls")
    shards = wdsx.SimpleShardList(sys.argv[1:])
    assert "torch" not in sys.modules, "wdsx imported torch"
    from torch.utils.data import DataLoader, IterableDataset

    batches = [list(keys) for keys, _ in DataLoader(dataset, batch_size=4)]
    print(json.dumps([isinstance(shards, IterableDataset), batches]))
    """
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return list(make_shards(str(tmp_path_factory.mktemp("late")), [5, 3, 6]).urls)


def test_a_dataset_built_before_torch_is_imported_is_an_iterable_dataset(shards):
    expected = webdataset.WebDataset(shards, shardshuffle=False).to_tuple("__key__", "cls")
    expected_batches = [list(keys) for keys, _ in DataLoader(expected, batch_size=4)]
    run = subprocess.run(
        [sys.executable, "-c", LATE_IMPORT, *shards], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    is_iterable, batches = json.loads(run.stdout)
    assert is_iterable
    assert batches == expected_batches
