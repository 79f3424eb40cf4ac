"""wdsx: fast, exactly resumable streaming of WebDataset tar shards.

``import wdsx as wds`` runs code written for ``import webdataset as wds``. On top of that,
every pipeline and loader has ``state_dict()`` / ``load_state_dict()`` that resume mid-epoch
exactly, WebLoader feeds multi-node jobs with equal batch counts per rank, and shards can live
on local disks, ``s3://``, ``http(s)://`` or behind ``pipe:`` commands.

Importing wdsx does not import torch; torch is used only by WebLoader and tensor outputs.
"""

# webdataset's modules under their own names: faces over wdsx's layers. As in webdataset,
# wdsx.gopen is the function; its module is reached by ``from wdsx.gopen import ...``.
from wdsx import (
    autodecode,
    cache,
    compat,
    extradatasets,
    filters,
    handlers,
    mix,
    pipeline,
    pytorch,
    shardlists,
    tariterators,
    tenbin,
    utils,
    writer,
)
from wdsx.cache import (
    LRUCleanup,
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    lru_cleanup,
    maybe_cached_tarfile_to_samples,
)
from wdsx.cborsiterators import cbors2_to_samples, cbors_to_samples
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
from wdsx.codecs.encoders import numpy_dumps, torch_dumps
from wdsx.codecs.legacydecode import weights_only as _weights_only
from wdsx.core.errors import (
    DecodingError,
    EncodingError,
    NoSamplesError,
    NotResumableError,
    ShardError,
    SourceError,
    StateError,
    WdsxError,
    WriteError,
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)
from wdsx.core.faces import environment_setting as _environment_setting
from wdsx.core.faces import flag as _flag
from wdsx.core.faces import live_settings as _live_settings
from wdsx.core.topology import pytorch_worker_info
from wdsx.core.utilities import pipe_cleaner
from wdsx.gopen import gopen, gopen_schemes
from wdsx.loader.check import ResumeReport, check_resume
from wdsx.loader.webloader import WebLoader, gather_loader_state, split_loader_state
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.pipeline.datasets import MockDataset, with_epoch, with_length
from wdsx.pipeline.fluid import FluidInterface
from wdsx.pipeline.indexed import IndexedDataset, ShardLocalSampler
from wdsx.pipeline.mixing import Mix, RandomMix, RoundRobin
from wdsx.pipeline.randomness import current_rng, sample_rng
from wdsx.pipeline.schedules import PiecewiseConstant, PiecewiseLinear
from wdsx.pipeline.webdataset import FluidWrapper, WebDataset
from wdsx.read.fieldsets import FieldSet
from wdsx.read.manifest import Manifest
from wdsx.read.samples import POSITION
from wdsx.sources import SourceOptions
from wdsx.stages.base import Stage, pipelinefilter, stateless
from wdsx.stages.batch import batched, listed, unbatched, unlisted
from wdsx.stages.bucket import bucket
from wdsx.stages.caching import Cached, LMDBCached
from wdsx.stages.collate import collate_torch, default_collation_fn
from wdsx.stages.custom import PipelineStage
from wdsx.stages.pack import collate_packed, pack
from wdsx.stages.plain import repeatedly
from wdsx.stages.reading import tarfile_samples, tarfile_to_samples
from wdsx.stages.resampling import resampled
from wdsx.stages.resized import decode_resized
from wdsx.stages.shardlists import (
    ResampledShardList,
    ResampledShards,
    SimpleShardList,
    expand_urls,
    non_empty,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from wdsx.stages.shardspecs import MultiShardSample, shardspec
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
from wdsx.state.position import Position
from wdsx.version import __version__
from wdsx.write.dataset import WriteReport, write_dataset
from wdsx.write.fieldsets import write_field_set
from wdsx.write.jsonl import JsonlShardWriter, JsonlWriter
from wdsx.write.writer import ShardWriter, TarWriter

_live_settings(
    __name__,
    {
        "pytorch_weights_only": _environment_setting(
            "WDS_PYTORCH_WEIGHTS_ONLY",
            _weights_only,
            "torch.load's weights_only (see wdsx.autodecode)",
            _flag,
        )
    },
)

# What ``from wdsx import *`` gives: the public names, sorted. The modules above stay reachable as
# attributes (``wdsx.tenbin``) for code written against webdataset, but are not star-imported, and
# neither are wdsx's own layer packages (wdsx.core, wdsx.read, ...). The live setting
# pytorch_weights_only is left out too: it is read as wdsx.pytorch_weights_only each time, where a
# star import would copy it once. tests/test_package.py checks this list.
__all__ = [
    "Cached",
    "Continue",
    "DataPipeline",
    "Decoder",
    "DecodingError",
    "EncodingError",
    "FieldSet",
    "FluidInterface",
    "FluidWrapper",
    "ImageHandler",
    "IndexedDataset",
    "JsonlShardWriter",
    "JsonlWriter",
    "LMDBCached",
    "LRUCleanup",
    "Manifest",
    "Mix",
    "MockDataset",
    "MultiShardSample",
    "NoSamplesError",
    "NotResumableError",
    "POSITION",
    "PiecewiseConstant",
    "PiecewiseLinear",
    "PipelineStage",
    "Position",
    "RandomMix",
    "ResampledShardList",
    "ResampledShards",
    "ResumeReport",
    "RoundRobin",
    "ShardError",
    "ShardLocalSampler",
    "ShardWriter",
    "SimpleShardList",
    "SourceError",
    "SourceOptions",
    "Stage",
    "StateError",
    "TarWriter",
    "WdsxError",
    "WebDataset",
    "WebLoader",
    "WriteError",
    "WriteReport",
    "associate",
    "basichandlers",
    "batched",
    "bucket",
    "cached_tarfile_samples",
    "cached_tarfile_to_samples",
    "cbors2_to_samples",
    "cbors_to_samples",
    "check_resume",
    "collate_packed",
    "collate_torch",
    "current_rng",
    "decode",
    "decode_resized",
    "default_collation_fn",
    "detshuffle",
    "expand_urls",
    "extract_keys",
    "gather_loader_state",
    "getfirst",
    "gopen",
    "gopen_schemes",
    "gzfilter",
    "handle_extension",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "imagespecs",
    "info",
    "listed",
    "log_keys",
    "lru_cleanup",
    "map",
    "map_dict",
    "map_tuple",
    "maybe_cached_tarfile_to_samples",
    "non_empty",
    "numpy_dumps",
    "pack",
    "pipe_cleaner",
    "pipelinefilter",
    "pytorch_worker_info",
    "rename",
    "rename_keys",
    "repeatedly",
    "reraise_exception",
    "resampled",
    "rsample",
    "sample_rng",
    "select",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "split_loader_state",
    "stateless",
    "tarfile_samples",
    "tarfile_to_samples",
    "to_tuple",
    "torch_audio",
    "torch_dumps",
    "torch_loads",
    "torch_video",
    "transform_with",
    "unbatched",
    "unlisted",
    "warn_and_continue",
    "warn_and_stop",
    "with_epoch",
    "with_length",
    "write_dataset",
    "write_field_set",
    "xdecode",
]
