"""webdataset's ``cache`` module. wdsx caches shards itself when given a cache directory
(``WebDataset(cache_dir=...)``, ``WDS_CACHE``, or ``SourceOptions(cache_dir=...)``), so of
webdataset's cache machinery only ``pipe_cleaner`` remains."""

from wdsx.core.faces import absent_names
from wdsx.core.utilities import pipe_cleaner

_USE_CACHE_DIR = (
    "pass cache_dir= (and cache_size=) to WebDataset, or SourceOptions(cache_dir=...) to tarfile_to_samples"
)
ABSENT = {
    "FileCache": _USE_CACHE_DIR,
    "StreamingOpen": "tarfile_to_samples() opens the URLs it is given itself",
    "LRUCleanup": "wdsx's cache evicts least recently used shards itself to stay under cache_size",
    "download": "use wdsx.gopen(url) to read a URL",
    "url_to_cache_name": "wdsx names cache entries by URL hash (wdsx.sources.cache.cache_path)",
    "islocal": "no replacement; wdsx.sources.scheme_of(url) == 'file' tells local URLs",
    "get_filetype": "no replacement; wdsx checks shards as it reads them",
    "magic_filetype": "no replacement; wdsx checks shards as it reads them",
    "check_tar_format": "run `wdsx verify URL`",
    "default_cache_dir": "wdsx caches only when given a cache directory (cache_dir= or WDS_CACHE)",
    "default_cache_size": "pass cache_size= with cache_dir= (or set WDS_CACHE_SIZE)",
    "verbose_cache": "wdsx logs cache activity on the 'wdsx' logger",
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = ["pipe_cleaner"]
