"""webdataset's ``tariterators`` module: from URLs to tar members to samples."""

from wdsx.core.errors import reraise_exception
from wdsx.read.members import (
    base_plus_ext,
    group_by_keys,
    shardlist,
    tar_file_expander,
    tar_file_iterator,
    url_opener,
    valid_sample,
)
from wdsx.stages.reading import tarfile_samples, tarfile_to_samples

# Module settings of webdataset's own readers, which programs that copy those readers import.
# wdsx's readers skip the same metadata names and log on the 'wdsx' logger instead of printing.
trace = False
"""webdataset's ``group_by_keys`` prints its decisions when this is set."""
meta_prefix = "__"
"""Top-level members whose names start with this and end with :data:`meta_suffix` are metadata."""
meta_suffix = "__"

__all__ = [
    "base_plus_ext",
    "group_by_keys",
    "meta_prefix",
    "meta_suffix",
    "reraise_exception",
    "shardlist",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "trace",
    "url_opener",
    "valid_sample",
]
