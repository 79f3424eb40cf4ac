"""The fluent methods shared by WebDataset, WebLoader and DataPipeline.

Each method returns a copy of the pipeline with one more stage (``compose``), exactly as in
webdataset, so ``WebDataset(urls).shuffle(1000).decode("pil").to_tuple("jpg", "cls")`` builds
the same stages as the functional ``DataPipeline(...)`` form.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from wdsx.core.errors import Handler, reraise_exception
from wdsx.stages import batch, caching, collate, resized, shuffle
from wdsx.stages import transforms as stages

F = TypeVar("F", bound="FluidInterface")


class FluidInterface:
    """Fluent stage methods; the class using it provides ``compose(*stages)`` and ``close()``.

    It is also a context manager, as webdataset's WebDataset is: leaving ``with`` closes the
    live iteration (and the shards it holds open).
    """

    def compose(self, *args: Any) -> Any:  # pragma: no cover - provided by the pipeline
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - provided by the pipeline
        raise NotImplementedError

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def batched(
        self,
        batchsize: int,
        collation_fn: Callable | None = collate.default_collation_fn,
        partial: bool = True,
    ) -> Any:
        return self.compose(batch.batched(batchsize, collation_fn, partial))

    def unbatched(self) -> Any:
        return self.compose(batch.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        return self.compose(batch.listed(batchsize, partial))

    def unlisted(self) -> Any:
        return self.compose(batch.unlisted())

    def log_keys(self, logfile: str | None = None) -> Any:
        return self.compose(stages.log_keys(logfile))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Buffer shuffle of ``size`` items; ``size < 1`` adds nothing (as in webdataset)."""
        if size < 1:
            return self
        return self.compose(shuffle.shuffle(size, **kw))

    def map(self, f: Callable, handler: Handler = reraise_exception) -> Any:
        return self.compose(stages.map(f, handler=handler))

    def decode(
        self,
        *args: Any,
        pre: Any = None,
        post: Any = None,
        only: Any = None,
        partial: bool = False,
        handler: Handler = reraise_exception,
    ) -> Any:
        return self.compose(
            stages.decode(*args, pre=pre, post=post, only=only, partial=partial, handler=handler)
        )

    def decode_resized(self, size: int | tuple[int, int], **kw: Any) -> Any:
        """Decode with image fields as ``size`` crops, decoded at a reduced JPEG scale where
        that gives enough pixels (:func:`wdsx.stages.resized.decode_resized`)."""
        return self.compose(resized.decode_resized(size, **kw))

    def map_dict(self, handler: Handler = reraise_exception, **kw: Callable) -> Any:
        return self.compose(stages.map_dict(handler=handler, **kw))

    def select(self, predicate: Callable) -> Any:
        return self.compose(stages.select(predicate))

    def to_tuple(self, *args: str, **kw: Any) -> Any:
        return self.compose(stages.to_tuple(*args, **kw))

    def map_tuple(self, *args: Callable | None, handler: Handler = reraise_exception) -> Any:
        return self.compose(stages.map_tuple(*args, handler=handler))

    def slice(self, *args: int | None) -> Any:
        return self.compose(stages.slice(*args))

    def rename(self, **kw: Any) -> Any:
        return self.compose(stages.rename(**kw))

    def rsample(self, p: float = 0.5) -> Any:
        return self.compose(stages.rsample(p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        return self.compose(stages.rename_keys(*args, **kw))

    def extract_keys(self, *args: str, **kw: Any) -> Any:
        return self.compose(stages.extract_keys(*args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        return self.compose(stages.xdecode(*args, **kw))

    def mcached(self) -> Any:
        """Keep the first complete pass in memory and replay it afterwards."""
        return self.compose(caching.Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Keep the first complete pass in an LMDB database (see :class:`~wdsx.stages.caching.LMDBCached`)."""
        return self.compose(caching.LMDBCached(*args, **kw))
