"""Pipelines; also webdataset's ``pipeline`` module (``from wdsx.pipeline import DataPipeline``)."""

from wdsx.core.faces import torch_names
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.length import add_length_method
from wdsx.stages.custom import PipelineStage

__getattr__ = torch_names(__name__)

__all__ = ["DataPipeline", "PipelineStage", "add_length_method"]
