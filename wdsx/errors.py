"""wdsx's exceptions and webdataset's error handlers, for ``from wdsx.errors import ...``."""

from wdsx.core.errors import (
    AbsentNameError,
    DecodingError,
    EncodingError,
    NoSamplesError,
    NotResumableError,
    ShardError,
    SourceError,
    StateError,
    UnsupportedError,
    WdsxError,
    WriteError,
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)

__all__ = [
    "AbsentNameError",
    "DecodingError",
    "EncodingError",
    "NoSamplesError",
    "NotResumableError",
    "ShardError",
    "SourceError",
    "StateError",
    "UnsupportedError",
    "WdsxError",
    "WriteError",
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]
