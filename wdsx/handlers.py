"""webdataset's ``handlers`` module: the error handlers."""

from wdsx.core.errors import (
    ignore_and_continue,
    ignore_and_stop,
    reraise_exception,
    warn_and_continue,
    warn_and_stop,
)

__all__ = [
    "ignore_and_continue",
    "ignore_and_stop",
    "reraise_exception",
    "warn_and_continue",
    "warn_and_stop",
]
