"""webdataset's ``gopen`` module: open any URL wdsx can read or write as a file.

As in webdataset, ``wdsx.gopen`` is the function and this module is reached by
``from wdsx.gopen import ...``. wdsx opens URLs through its sources (local files, ``pipe:``,
``http(s)://``, ``s3://``, ``gs://``, ``az://``, ``hf://``, fsspec); ``gopen_schemes`` shows
webdataset's table, and an opener a program sets there is what wdsx then uses for that scheme
(see :mod:`wdsx.sources.schemes`). The ``gopen_*`` openers are webdataset's command-line ones,
for programs that call them or put them in the table.
"""

from subprocess import PIPE
from typing import Any

from wdsx.sources import rewrite_url
from wdsx.sources.commandpipe import Pipe, set_options
from wdsx.sources.schemes import (
    gopen,
    gopen_ais,
    gopen_curl,
    gopen_error,
    gopen_file,
    gopen_gsutil,
    gopen_hf,
    gopen_htgs,
    gopen_pipe,
    gopen_schemes,
    reader,
)

info: dict[str, Any] = {}
"""webdataset's dict of details that verbose gopen messages show; wdsx logs on the 'wdsx'
logger, so nothing reads it."""

__all__ = [
    "PIPE",
    "Pipe",
    "gopen",
    "gopen_ais",
    "gopen_curl",
    "gopen_error",
    "gopen_file",
    "gopen_gsutil",
    "gopen_hf",
    "gopen_htgs",
    "gopen_pipe",
    "gopen_schemes",
    "info",
    "reader",
    "rewrite_url",
    "set_options",
]
