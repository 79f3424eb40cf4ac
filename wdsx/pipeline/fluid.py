"""The fluent methods shared by WebDataset, WebLoader and DataPipeline.

Each method returns a copy of the pipeline with one more stage (``compose``), exactly as in
webdataset, so ``WebDataset(urls).shuffle(1000).decode("pil").to_tuple("jpg", "cls")`` builds
the same stages as the functional ``DataPipeline(...)`` form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from wdsx.core.errors import Handler, reraise_exception
from wdsx.pipeline import samplemaps
from wdsx.stages import batch, caching, collate, resized, shuffle
from wdsx.stages import bucket as bucketing
from wdsx.stages import pack as packing
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
        """Groups of ``batchsize`` items, collated (``collation_fn=None``: plain lists);
        ``partial=False`` drops a short last batch."""
        return self.compose(batch.batched(batchsize, collation_fn, partial))

    def bucket(
        self, key: Callable[[Any], Any], boundaries: Sequence[float] | None, batch_size: int, **kw: Any
    ) -> Any:
        """Batches of ``batch_size`` items whose ``key`` falls in the same bucket; ``max_held``,
        ``partial`` and ``collation_fn`` as in :func:`wdsx.stages.bucket.bucket`."""
        return self.compose(bucketing.bucket(key, boundaries, batch_size, **kw))

    def pack(self, field: str, length: int, **kw: Any) -> Any:
        """Documents of tokens in ``field`` packed into rows of ``length`` tokens
        (:func:`wdsx.stages.pack.pack`)."""
        return self.compose(packing.pack(field, length, **kw))

    def unbatched(self) -> Any:
        """Split batches back into their items."""
        return self.compose(batch.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Groups of ``batchsize`` items as plain lists (no collation)."""
        return self.compose(batch.listed(batchsize, partial))

    def unlisted(self) -> Any:
        """Split lists back into their items."""
        return self.compose(batch.unlisted())

    def log_keys(self, logfile: str | None = None) -> Any:
        """Log each sample's ``__key__`` (to ``logfile``, else the ``wdsx`` logger)."""
        return self.compose(stages.log_keys(logfile))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Buffer shuffle of ``size`` items; ``size < 1`` adds nothing (as in webdataset)."""
        if size < 1:
            return self
        return self.compose(shuffle.shuffle(size, **kw))

    def map(self, f: Callable, handler: Handler = reraise_exception, rng: bool = False) -> Any:
        """Apply ``f`` to each sample; with ``rng=True``, ``wdsx.current_rng()`` inside ``f`` is
        the sample's own generator (:mod:`wdsx.pipeline.samplemaps`)."""
        return self._mapping(stages.map(f, handler=handler), rng)

    def _mapping(self, transform: stages.Transform, rng: bool) -> Any:
        return samplemaps.with_item_rng(self, transform) if rng else self.compose(transform)

    def decode(
        self,
        *args: Any,
        pre: Any = None,
        post: Any = None,
        only: Any = None,
        partial: bool = False,
        handler: Handler = reraise_exception,
    ) -> Any:
        """Decode fields by extension: ``"rgb8"``, ``"pil"``, ``"torchrgb"``... for images, and
        text, JSON, ints, arrays by default (see the Decoding guide); ``only``: these fields."""
        return self.compose(
            stages.decode(*args, pre=pre, post=post, only=only, partial=partial, handler=handler)
        )

    def decode_resized(self, size: int | tuple[int, int], **kw: Any) -> Any:
        """Decode with image fields as ``size`` crops, decoded at a reduced JPEG scale where
        that gives enough pixels (:func:`wdsx.stages.resized.decode_resized`)."""
        return self.compose(resized.decode_resized(size, **kw))

    def map_dict(self, handler: Handler = reraise_exception, **kw: Callable) -> Any:
        """Apply ``kw[field]`` to each named field of the sample."""
        return self.compose(stages.map_dict(handler=handler, **kw))

    def select(self, predicate: Callable) -> Any:
        """Keep the items for which ``predicate(item)`` is true."""
        return self.compose(stages.select(predicate))

    def to_tuple(self, *args: str, **kw: Any) -> Any:
        """Tuples of the named fields (``"jpg;png"``: the first present of several)."""
        return self.compose(stages.to_tuple(*args, **kw))

    def map_tuple(
        self, *args: Callable | None, handler: Handler = reraise_exception, rng: bool = False
    ) -> Any:
        """Apply the i-th function to the i-th element of tuple samples; with ``rng=True``,
        ``wdsx.current_rng()`` inside them is the sample's own generator."""
        return self._mapping(stages.map_tuple(*args, handler=handler), rng)

    def slice(self, *args: int | None) -> Any:
        """Items as ``itertools.islice(items, *args)`` gives them."""
        return self.compose(stages.slice(*args))

    def rename(self, **kw: Any) -> Any:
        """Rename fields: ``rename(image="jpg;png")`` (the first present of several names)."""
        return self.compose(stages.rename(**kw))

    def rsample(self, p: float = 0.5) -> Any:
        """Keep each item with probability ``p`` (a resumable, seeded draw)."""
        return self.compose(stages.rsample(p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        """Rename fields by patterns: ``(new, old-pattern)`` pairs or ``new="pattern"``."""
        return self.compose(stages.rename_keys(*args, **kw))

    def extract_keys(self, *args: str, **kw: Any) -> Any:
        """Tuples of the fields whose names match the given patterns."""
        return self.compose(stages.extract_keys(*args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        """Decode the fields whose names match patterns with the functions given for them."""
        return self.compose(stages.xdecode(*args, **kw))

    def mcached(self) -> Any:
        """Keep the first complete pass in memory and replay it afterwards."""
        return self.compose(caching.Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Keep the first complete pass in an LMDB database (see :class:`~wdsx.stages.caching.LMDBCached`)."""
        return self.compose(caching.LMDBCached(*args, **kw))
