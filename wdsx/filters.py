"""webdataset's ``filters`` module: the curried stages and their helpers."""

from wdsx.core.errors import reraise_exception
from wdsx.core.faces import absent_names
from wdsx.stages.base import pipelinefilter
from wdsx.stages.batch import batched, unbatched, unlisted
from wdsx.stages.caching import Cached, LMDBCached
from wdsx.stages.collate import default_collation_fn
from wdsx.stages.plain import compose, compose2, identity, pipeline
from wdsx.stages.shuffle import detshuffle, shuffle
from wdsx.stages.transforms import (
    associate,
    decode,
    decode_bin,
    decode_pickle,
    decode_text,
    default_decoders,
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

_COLLATE = (
    "use default_collation_fn(samples, combine_tensors=..., combine_scalars=...) or your own collation_fn"
)
ABSENT = {
    "FilterFunction": "wdsx's curried filters are stages (wdsx.Stage); call one on an iterator to run it",
    "RestCurried": "pipelinefilter(f) returns a function that makes stages (wdsx.Stage)",
    "pick": "internal to webdataset's shuffle buffer; use shuffle(bufsize)",
    "parse_field_spec": "internal to to_tuple; pass to_tuple('jpg;png', 'cls')",
    "find_decoder": "xdecode(...) picks the decoder for each field by pattern",
    "combine_values": _COLLATE,
    "tuple2dict": _COLLATE,
    "dict2tuple": _COLLATE,
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "Cached",
    "LMDBCached",
    "associate",
    "batched",
    "compose",
    "compose2",
    "decode",
    "decode_bin",
    "decode_pickle",
    "decode_text",
    "default_collation_fn",
    "default_decoders",
    "detshuffle",
    "extract_keys",
    "getfirst",
    "identity",
    "info",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "pipeline",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "reraise_exception",
    "rsample",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "transform_with",
    "unbatched",
    "unlisted",
    "xdecode",
]
