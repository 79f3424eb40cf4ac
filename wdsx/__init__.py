"""wdsx: fast, exactly resumable streaming of WebDataset tar shards.

``import wdsx as wds`` runs code written for ``import webdataset as wds``. On top of that,
every pipeline and loader has ``state_dict()`` / ``load_state_dict()`` that resume mid-epoch
exactly, WebLoader feeds multi-node jobs with equal batch counts per rank, and shards can live
on local disks, ``s3://``, ``http(s)://`` or behind ``pipe:`` commands.

Importing wdsx does not import torch; torch is used only by WebLoader and tensor outputs.
"""

from wdsx.codecs.decode import (
    Continue,
    Decoder,
    ImageHandler,
    basichandlers,
    gzfilter,
    handle_extension,
    imagehandler,
    imagespecs,
    torch_audio,
    torch_loads,
    torch_video,
)
from wdsx.core.errors import (
    DecodingError,
    NotResumableError,
    ShardError,
    SourceError,
    StateError,
    WdsxError,
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from wdsx.core.topology import pytorch_worker_info
from wdsx.loader.webloader import WebLoader, gather_loader_state, split_loader_state
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.fluid import FluidInterface
from wdsx.pipeline.webdataset import FluidWrapper, WebDataset
from wdsx.read.manifest import Manifest
from wdsx.read.samples import POSITION
from wdsx.sources import SourceOptions
from wdsx.sources.gopen import gopen
from wdsx.stages.base import Stage, pipelinefilter, stateless
from wdsx.stages.batch import batched, collate_torch, default_collation_fn, listed, unbatched, unlisted
from wdsx.stages.reading import tarfile_samples, tarfile_to_samples
from wdsx.stages.shardlists import (
    ResampledShardList,
    ResampledShards,
    SimpleShardList,
    expand_urls,
    non_empty,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from wdsx.stages.shuffle import detshuffle, shuffle
from wdsx.stages.transforms import (
    associate,
    decode,
    extract_keys,
    getfirst,
    info,
    log_keys,
    map,
    map_dict,
    map_tuple,
    rename,
    rename_keys,
    rsample,
    select,
    slice,
    to_tuple,
    transform_with,
    xdecode,
)
from wdsx.write.writer import ShardWriter, TarWriter

__version__ = "0.1.0"

__all__ = [name for name in dir() if not name.startswith("_")]
