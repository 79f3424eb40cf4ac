"""webdataset's ``utils`` module: repeating loaders, seeds, globbing, and PipelineStage."""

from wdsx.core.faces import absent_names
from wdsx.core.topology import pytorch_worker_info
from wdsx.core.utilities import (
    fnmatch_with_braces,
    glob_with_braces,
    is_iterable,
    make_seed,
    pytorch_worker_seed,
)
from wdsx.stages.custom import PipelineStage
from wdsx.stages.plain import guess_batchsize, identity, repeatedly, repeatedly0

_INTERNAL = "an internal helper of webdataset with no use in wdsx"
ABSENT = {
    "safe_eval": "wdsx evaluates no strings; write the expression in Python",
    "lookup_sym": "wdsx evaluates no strings; import the object",
    "deprecated": _INTERNAL,
    "obsolete": _INTERNAL,
    "ObsoleteException": _INTERNAL,
    "compute_sample_weights": _INTERNAL,
    "enforce_security": "set WDS_SECURE=1 in the environment; wdsx reads it whenever it decodes",
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "PipelineStage",
    "fnmatch_with_braces",
    "glob_with_braces",
    "guess_batchsize",
    "identity",
    "is_iterable",
    "make_seed",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
    "repeatedly0",
]
