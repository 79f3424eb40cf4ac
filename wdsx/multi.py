"""webdataset's ``multi`` module: ``MultiLoader``, a DataLoader alternative that needs no
torch (here without ZMQ either; see :mod:`wdsx.loader.multi`)."""

from wdsx.loader.multi import EOF, MultiLoader, all_pids, reader, the_protocol

__all__ = ["EOF", "MultiLoader", "all_pids", "reader", "the_protocol"]
