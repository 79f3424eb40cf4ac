"""webdataset's ``compat`` module: the fluent classes."""

from wdsx.loader.webloader import WebLoader
from wdsx.pipeline.fluid import FluidInterface
from wdsx.pipeline.webdataset import FluidWrapper, WebDataset
from wdsx.stages.shardlists import non_empty as check_empty

__all__ = ["FluidInterface", "FluidWrapper", "WebDataset", "WebLoader", "check_empty"]
