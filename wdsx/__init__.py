"""wdsx: fast, exactly resumable streaming of WebDataset tar shards."""

__version__ = "0.1.0"
