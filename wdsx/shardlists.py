"""webdataset's ``shardlists`` module: shard lists, splitting by rank and worker, resampling,
YAML dataset specs and directory work queues."""

from wdsx.core.faces import torch_names
from wdsx.core.legacy import obsolete
from wdsx.core.utilities import is_iterable
from wdsx.sources.listing import envsubst, expand_urls
from wdsx.stages.base import pipelinefilter
from wdsx.stages.directoryshards import (
    DirectoryShardList,
    check_pid_is_running,
    get_pid_from_filename,
    without_last_extension,
)
from wdsx.stages.resampling import resampled, resampled_
from wdsx.stages.shardlists import (
    ResampledShardList,
    ResampledShards,
    SimpleShardList,
    non_empty,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from wdsx.stages.shardspecs import (
    MSSource,
    MultiShardSample,
    default_rng,
    envlookup,
    expand,
    expand_source,
    shardspec,
)

__getattr__ = torch_names(__name__)

__all__ = [
    "DirectoryShardList",
    "MSSource",
    "MultiShardSample",
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "check_pid_is_running",
    "default_rng",
    "envlookup",
    "envsubst",
    "expand",
    "expand_source",
    "expand_urls",
    "get_pid_from_filename",
    "is_iterable",
    "non_empty",
    "obsolete",
    "pipelinefilter",
    "resampled",
    "resampled_",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "without_last_extension",
]
