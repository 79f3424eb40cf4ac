"""webdataset's ``utils`` module: repeating loaders, seeds, globbing, PipelineStage, and
webdataset's general helpers.

``enforce_security`` reads ``WDS_SECURE`` (wdsx's secure mode: no ``pipe:`` commands, no
unpickling) when used; assigning it sets the variable, so ``utils.enforce_security = True``
takes effect, in DataLoader workers started afterwards too.
"""

from wdsx.core.env import secure_mode
from wdsx.core.faces import environment_setting, flag, live_settings
from wdsx.core.legacy import (
    ObsoleteException,
    compute_sample_weights,
    deprecated,
    lookup_sym,
    obsolete,
    safe_eval,
)
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

live_settings(
    __name__,
    {
        "enforce_security": environment_setting(
            "WDS_SECURE", secure_mode, "WDS_SECURE: wdsx's secure mode", flag
        )
    },
)

__all__ = [
    "ObsoleteException",
    "PipelineStage",
    "compute_sample_weights",
    "deprecated",
    "fnmatch_with_braces",
    "glob_with_braces",
    "guess_batchsize",
    "identity",
    "is_iterable",
    "lookup_sym",
    "make_seed",
    "obsolete",
    "pytorch_worker_info",
    "pytorch_worker_seed",
    "repeatedly",
    "repeatedly0",
    "safe_eval",
]
