"""webdataset 0.2's ``cborsiterators`` module: reading ``.cbors`` shards (see
:mod:`wdsx.stages.cbors`)."""

from wdsx.stages.cbors import (
    cbor2_iterator,
    cbor_iterator,
    cbors2_samples,
    cbors2_to_samples,
    cbors_samples,
    cbors_to_samples,
)

__all__ = [
    "cbor2_iterator",
    "cbor_iterator",
    "cbors2_samples",
    "cbors2_to_samples",
    "cbors_samples",
    "cbors_to_samples",
]
