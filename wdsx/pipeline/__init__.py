"""Pipelines; also webdataset's ``pipeline`` module (``from wdsx.pipeline import DataPipeline``)."""

from wdsx.core.faces import absent_names
from wdsx.pipeline.datapipeline import DataPipeline

ABSENT = {"add_length_method": "call .with_length(n) on the pipeline"}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = ["DataPipeline"]
