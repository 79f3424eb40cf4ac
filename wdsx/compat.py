"""webdataset's ``compat`` module: the fluent classes."""

from wdsx.core.errors import reraise_exception
from wdsx.core.faces import torch_names
from wdsx.loader.webloader import WebLoader
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.fluid import FluidInterface
from wdsx.pipeline.webdataset import FluidWrapper, WebDataset
from wdsx.read.members import group_by_keys, tar_file_expander
from wdsx.stages.base import pipelinefilter
from wdsx.stages.shardlists import non_empty as check_empty

__getattr__ = torch_names(__name__)

__all__ = [
    "DataPipeline",
    "FluidInterface",
    "FluidWrapper",
    "WebDataset",
    "WebLoader",
    "check_empty",
    "group_by_keys",
    "pipelinefilter",
    "reraise_exception",
    "tar_file_expander",
]
