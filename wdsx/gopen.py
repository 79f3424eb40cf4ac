"""webdataset's ``gopen`` module: open any URL wdsx can read or write as a file.

As in webdataset, ``wdsx.gopen`` is the function and this module is reached by
``from wdsx.gopen import ...``. wdsx opens URLs through its sources (local files, ``pipe:``,
``http(s)://``, ``s3://``), so webdataset's per-scheme openers are not here.
"""

from wdsx.core.faces import absent_names
from wdsx.sources import rewrite_url
from wdsx.sources.gopen import gopen

_REGISTER = "register a scheme with wdsx.sources.register(scheme, opener)"
_OPEN = "call gopen(url), which picks the opener from the URL's scheme"
ABSENT = {
    "gopen_schemes": _REGISTER,
    "Pipe": "open 'pipe:COMMAND' URLs with gopen(url)",
    "set_options": "pass options=wdsx.SourceOptions(...) (timeouts, retries, buffer sizes)",
    "info": "wdsx logs on the 'wdsx' logger",
    "reader": "call gopen(url, 'rb')",
    "gopen_file": _OPEN,
    "gopen_pipe": _OPEN,
    "gopen_curl": _OPEN,
    "gopen_htgs": _OPEN,
    "gopen_hf": _OPEN,
    "gopen_gsutil": _OPEN,
    "gopen_ais": _OPEN,
    "gopen_error": _REGISTER,
}
__getattr__ = absent_names(__name__, ABSENT)

__all__ = ["gopen", "rewrite_url"]
