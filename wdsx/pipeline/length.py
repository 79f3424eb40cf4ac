"""webdataset's ``add_length_method``: give an object a ``len()`` from its ``size`` attribute."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def add_length_method(obj: T) -> T:
    """Make ``len(obj)`` return ``obj.size`` by moving ``obj`` to a subclass of its class
    (named ``<Class>_Length``) that has ``__len__``; returns ``obj``. For a wdsx pipeline,
    ``.with_length(n)`` does this and more (and is kept in checkpoints)."""

    def length(self: object) -> int:
        return self.size  # type: ignore[attr-defined]

    cls = obj.__class__
    obj.__class__ = type(cls.__name__ + "_Length", (cls,), {"__len__": length})
    return obj
