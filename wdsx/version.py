"""wdsx's version, in the one place it is written: packaging reads it from here (pyproject.toml's
dynamic version) and ``wdsx.__version__`` re-exports it."""

__version__ = "0.1.0"
