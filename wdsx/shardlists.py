"""webdataset's ``shardlists`` module: shard lists, splitting by rank and worker, resampling."""

from wdsx.core.faces import absent_names
from wdsx.stages.resampling import resampled, resampled_
from wdsx.stages.shardlists import (
    ResampledShardList,
    ResampledShards,
    SimpleShardList,
    envsubst,
    expand_urls,
    non_empty,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)

_YAML = "YAML dataset specs are not supported; pass the shard URLs (a pattern or a list)"
_DIRECTORY = "list the directory with a glob pattern instead: WebDataset('dir/*.tar')"
ABSENT = {
    "MultiShardSample": _YAML,
    "MSSource": _YAML,
    "expand": _YAML,
    "default_rng": "wdsx draws every random choice from the pipeline's seed (seed=, or WDS_SEED)",
    "DirectoryShardList": _DIRECTORY,
    "check_pid_is_running": _DIRECTORY,
    "get_pid_from_filename": _DIRECTORY,
    "without_last_extension": _DIRECTORY,
    "envlookup": "envsubst(url) replaces ${VAR} with $WDS_VAR",
    "expand_source": "use expand_urls(urls), which takes a pattern string or a list",
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "ResampledShardList",
    "ResampledShards",
    "SimpleShardList",
    "envsubst",
    "expand_urls",
    "non_empty",
    "resampled",
    "resampled_",
    "shardspec",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
]
