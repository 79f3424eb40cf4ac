"""webdataset's ``tariterators`` module: from URLs to tar members to samples."""

from wdsx.core.faces import absent_names
from wdsx.read.members import (
    base_plus_ext,
    group_by_keys,
    tar_file_expander,
    tar_file_iterator,
    url_opener,
    valid_sample,
)
from wdsx.stages.reading import tarfile_samples, tarfile_to_samples

ABSENT = {
    "shardlist": "use SimpleShardList(urls) (seeded shuffling: SimpleShardList(urls, seed=...))",
    "trace": "wdsx logs on the 'wdsx' logger",
    "meta_prefix": "members named __*__ are always metadata; filter names with select_files=",
    "meta_suffix": "members named __*__ are always metadata; filter names with select_files=",
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = [
    "base_plus_ext",
    "group_by_keys",
    "tar_file_expander",
    "tar_file_iterator",
    "tarfile_samples",
    "tarfile_to_samples",
    "url_opener",
    "valid_sample",
]
