"""webdataset's ``typecheck`` module: importing it asks typeguard (when installed) to check
the type hints of wdsx's webdataset-named modules imported afterwards.

``modules`` lists those modules, as webdataset's does; without typeguard, importing this does
nothing.
"""

modules = [
    "tenbin",
    "autodecode",
    "cache",
    "cborsiterators",
    "compat",
    "extradatasets",
    "filters",
    "gopen",
    "handlers",
    "mix",
    "pipeline",
    "shardlists",
    "tariterators",
    "utils",
    "writer",
]

try:
    from typeguard import install_import_hook
except ImportError:
    pass
else:
    install_import_hook(["wdsx." + name for name in modules])

__all__ = ["modules"]
