"""webdataset's ``extradatasets`` module: a mock dataset and epoch/length wrappers."""

from wdsx.pipeline.datasets import MockDataset, with_epoch, with_length
from wdsx.stages.plain import repeatedly

__all__ = ["MockDataset", "repeatedly", "with_epoch", "with_length"]
