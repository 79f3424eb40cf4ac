"""webdataset's ``extradatasets`` module: a mock dataset and epoch/length wrappers."""

from wdsx.core.faces import torch_names
from wdsx.pipeline.datasets import MockDataset, with_epoch, with_length
from wdsx.stages.custom import PipelineStage
from wdsx.stages.plain import repeatedly

__getattr__ = torch_names(__name__)

__all__ = ["MockDataset", "PipelineStage", "repeatedly", "with_epoch", "with_length"]
