"""The client corpus's runs whose DataLoader workers are started by ``spawn`` (see
test_clients.py): they re-import the client and unpickle its dataset in every worker, the
longest runs of the corpus, kept in a file of their own so that the suite's processes share the
corpus's time."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.clients import shards as dataset
from tests.clients.packages import Client
from tests.test_clients import SPAWNED_CASES, compare_scenario


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("client-shards")
    dataset.write_dataset(str(directory))
    return str(directory)


@pytest.mark.slow
@pytest.mark.parametrize("client, path, workers, start_method", SPAWNED_CASES)
def test_a_client_with_spawned_workers_gets_the_batches_of_its_webdataset(
    client: Client, path: str, workers: int, start_method: str, shards: str, tmp_path: Path
):
    compare_scenario(client, path, workers, start_method, shards, tmp_path)
