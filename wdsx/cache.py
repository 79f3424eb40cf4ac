"""webdataset's ``cache`` module: the directory cache that programs assemble by hand.

wdsx caches shards itself when given a cache directory (``WebDataset(cache_dir=...)``,
``WDS_CACHE``, or ``SourceOptions(cache_dir=...)``), resumably and following downloads as they
grow. For programs that build webdataset's cache themselves (``FileCache`` as a stage,
``LRUCleanup`` on a directory, 0.2's ``cached_tarfile_to_samples``), the same objects are here,
downloading through wdsx's sources (see :mod:`wdsx.sources.filecache`).

``default_cache_dir``, ``default_cache_size`` and ``verbose_cache`` read ``WDS_CACHE``,
``WDS_CACHE_SIZE`` and ``WDS_VERBOSE_CACHE`` when used; assigning one sets the variable.
"""

from wdsx.core.errors import reraise_exception
from wdsx.core.faces import environment_setting, live_settings
from wdsx.core.legacy import obsolete
from wdsx.core.utilities import pipe_cleaner
from wdsx.sources import filecache
from wdsx.sources.filecache import (
    FileCache,
    LRUCleanup,
    StreamingOpen,
    check_tar_format,
    download,
    get_file_cached,
    get_filetype,
    islocal,
    lru_cleanup,
    magic_filetype,
    url_to_cache_name,
)
from wdsx.stages.cachedreading import (
    cached_tarfile_samples,
    cached_tarfile_to_samples,
    cached_url_opener,
    maybe_cached_tarfile_to_samples,
)

live_settings(
    __name__,
    {
        "default_cache_dir": environment_setting("WDS_CACHE", filecache.default_cache_dir, "WDS_CACHE"),
        "default_cache_size": environment_setting(
            "WDS_CACHE_SIZE", filecache.default_cache_size, "WDS_CACHE_SIZE"
        ),
        "verbose_cache": environment_setting(
            "WDS_VERBOSE_CACHE", filecache.verbose_cache, "WDS_VERBOSE_CACHE"
        ),
    },
)

__all__ = [
    "FileCache",
    "LRUCleanup",
    "StreamingOpen",
    "cached_tarfile_samples",
    "cached_tarfile_to_samples",
    "cached_url_opener",
    "check_tar_format",
    "download",
    "get_file_cached",
    "get_filetype",
    "islocal",
    "lru_cleanup",
    "magic_filetype",
    "maybe_cached_tarfile_to_samples",
    "obsolete",
    "pipe_cleaner",
    "reraise_exception",
    "url_to_cache_name",
]
