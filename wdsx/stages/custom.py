"""PipelineStage: webdataset's base class for stages written as classes.

webdataset runs any ``PipelineStage`` in a pipeline by calling its ``run(src)`` method with the
upstream iterator (or ``run()`` for a first stage). wdsx keeps that contract, so user classes
written for webdataset work unchanged; such a stage is opaque to checkpoints unless it is
marked with :func:`wdsx.stateless` (an object that neither buffers nor reorders items).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from wdsx.stages.base import CallableStage, Run, Stage


class PipelineStage(Stage):
    """Subclass and define ``run(self, src)`` returning an iterable of output items."""

    def run(self, *args: Any, **kwargs: Any) -> Iterable:
        raise NotImplementedError(f"{type(self).__name__} must define run(src)")

    def _as_callable(self) -> CallableStage:
        return CallableStage(self.run, stateless=bool(getattr(self, "__wdsx_stateless__", False)))

    def apply(self, upstream: Iterator, run: Run, index: int) -> Iterator:
        return self._as_callable().apply(upstream, run, index)

    def replay(self, item: Any) -> Any:
        return self._as_callable().replay(item)

    def describe(self) -> str:
        return f"stage({type(self).__qualname__})"

    def not_resumable(self) -> str | None:
        return self._as_callable().not_resumable()
