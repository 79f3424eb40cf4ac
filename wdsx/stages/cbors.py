"""webdataset 0.2's ``.cbors`` reading: shards that are a sequence of CBOR values, one sample
each (``wds.DataPipeline(wds.SimpleShardList("x.cbors"), wds.cbors_to_samples())``).

``cbors_*`` decode with the ``cbor`` package and ``cbors2_*`` with ``cbor2``, each imported
when first used; CBOR cannot construct arbitrary Python objects, so reading a shard runs none
of its contents. Not resumable: use tar or JSONL shards for that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from wdsx.core.errors import Handler, reraise_exception
from wdsx.read.members import url_opener
from wdsx.stages.base import pipelinefilter


def _decoded(data: Iterable[dict[str, Any]], load: Callable[[Any], Any], handler: Handler) -> Iterator[Any]:
    for source in data:
        stream = source["stream"]
        try:
            while True:
                yield load(stream)
        except EOFError:
            continue
        except Exception as exn:
            if handler(exn):
                continue
            return


def cbor_iterator(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, info: Any = None
) -> Iterator:
    """Each CBOR value of each opened stream (``{"stream": ...}`` items), with ``cbor``."""
    import cbor

    return _decoded(data, cbor.load, handler)


def cbor2_iterator(
    data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, info: Any = None
) -> Iterator:
    """Each CBOR value of each opened stream (``{"stream": ...}`` items), with ``cbor2``."""
    import cbor2

    return _decoded(data, cbor2.load, handler)


def cbors_samples(src: Iterable[dict[str, Any]], handler: Handler = reraise_exception) -> Iterator:
    """The samples of ``{"url": ...}`` items naming ``.cbors`` shards (``cbor`` package)."""
    return cbor_iterator(url_opener(src, handler=handler), handler)


def cbors2_samples(src: Iterable[dict[str, Any]], handler: Handler = reraise_exception) -> Iterator:
    """The samples of ``{"url": ...}`` items naming ``.cbors`` shards (``cbor2`` package)."""
    return cbor2_iterator(url_opener(src, handler=handler), handler)


cbors_to_samples = pipelinefilter(cbors_samples)
cbors2_to_samples = pipelinefilter(cbors2_samples)
