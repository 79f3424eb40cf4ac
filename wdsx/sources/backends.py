"""Registers the remote schemes. Each store's client library is imported only when one of its
URLs is first opened, so ``import wdsx`` stays light and a missing extra is named in the error."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from types import ModuleType

from wdsx.core.errors import SourceError
from wdsx.core.extras import install_hint
from wdsx.sources import FALLBACK, Opener, SinkOpener, register
from wdsx.sources.base import Sink, Source, SourceOptions
from wdsx.sources.http import open_http
from wdsx.sources.listing import Lister
from wdsx.sources.pipe import PipeSink, PipeSource


class _Store:
    """A store module (``wdsx.sources.NAME``) imported on first use, and the extra it needs."""

    def __init__(self, module: str, extra: str):
        self.module = module
        self.extra = extra

    def _load(self, url: str) -> ModuleType:
        try:
            return importlib.import_module(f"wdsx.sources.{self.module}")
        except ImportError as exn:
            scheme = url.partition(":")[0]
            raise SourceError(
                url, f"{scheme}:// URLs need {exn.name!r}: {install_hint(self.extra, exn.name or self.extra)}"
            ) from exn

    def reader(self, name: str) -> Opener:
        def open_(url: str, offset: int, options: SourceOptions, **bounds: int | None) -> Source:
            opener: Callable[..., Source] = getattr(self._load(url), name)
            return opener(url, offset, options, **bounds)

        return open_

    def writer(self, name: str) -> SinkOpener:
        def open_(url: str, options: SourceOptions) -> Sink:
            sink: SinkOpener = getattr(self._load(url), name)
            return sink(url, options)

        return open_

    def lister(self, name: str) -> Lister:
        def list_(prefix: str, options: SourceOptions) -> Iterable[str]:
            lister: Lister = getattr(self._load(prefix), name)
            return lister(prefix, options)

        return list_


def _register(schemes: tuple[str, ...], store: _Store, reader: str, writer: str | None, lister: str) -> None:
    for scheme in schemes:
        register(
            scheme,
            store.reader(reader),
            store.writer(writer) if writer else None,
            store.lister(lister),
            bounded=True,
        )


_register(("s3",), _Store("s3", "s3"), "open_s3", "S3Sink", "list_s3")
_register(("gs", "gcs"), _Store("gcs", "gcs"), "open_gcs", "GCSSink", "list_gcs")
_register(("az", "abfs", "abfss"), _Store("azure", "azure"), "open_azure", "AzureSink", "list_azure")
_register(("hf",), _Store("hf", "hf"), "open_hf", None, "list_hf")
_register((FALLBACK,), _Store("fsspec_store", "fsspec"), "open_fsspec", None, "list_fsspec")
register("http", open_http, bounded=True)
register("https", open_http, bounded=True)
register("pipe", PipeSource, PipeSink)
