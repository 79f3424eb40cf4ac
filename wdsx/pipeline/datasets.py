"""Small datasets webdataset provides in ``extradatasets``: a mock source, and wrappers that
set an epoch length or a ``len()``.

They are pipelines, so they work as DataLoader datasets, as the first stage of a
``DataPipeline`` and with the fluent methods. webdataset 1.0.2's ``with_epoch`` and
``with_length`` classes cannot be instantiated (they lack ``__iter__``); these work.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.stages.base import Run, Stage


class _Repeat(Stage):
    """The same object, ``length`` times per epoch."""

    def __init__(self, sample: Any, length: int):
        self.sample = sample
        self.length = length

    def describe(self) -> str:
        return f"mock(length={self.length})"

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        sample = self.sample
        return (sample for _ in range(self.length))


class MockDataset(DataPipeline):
    """Yields ``sample`` (the same object) ``length`` times: a source for tests and for
    measuring the rest of a pipeline without any I/O."""

    def __init__(self, sample: Any, length: int):
        super().__init__(_Repeat(sample, length))
        self.sample = sample
        self.length = length


class with_epoch(DataPipeline):  # noqa: N801 - webdataset's name
    """``dataset`` with epochs of exactly ``length`` items: each ``iter()`` continues where the
    previous one stopped, starting the dataset over whenever it runs out."""

    def __init__(self, dataset: Any, length: int):
        super().__init__(dataset)
        self.with_epoch(length)


class with_length(DataPipeline):  # noqa: N801 - webdataset's name
    """``dataset`` unchanged, with ``len()`` returning ``length`` (for frameworks that ask)."""

    def __init__(self, dataset: Any, length: int):
        super().__init__(dataset)
        self.with_length(length, silent=True)
