"""Registers the remote schemes. boto3 is imported only when an ``s3://`` URL is opened."""

from __future__ import annotations

from types import ModuleType

from wdsx.core.errors import SourceError
from wdsx.sources import register
from wdsx.sources.base import Sink, Source, SourceOptions
from wdsx.sources.http import open_http
from wdsx.sources.pipe import PipeSink, PipeSource


def _s3_module(url: str) -> ModuleType:
    try:
        from wdsx.sources import s3
    except ImportError as exn:
        raise SourceError(url, f"s3:// URLs need {exn.name!r}: pip install 'wdsx[s3]'") from exn
    return s3


def _open_s3(url: str, offset: int, options: SourceOptions) -> Source:
    return _s3_module(url).open_s3(url, offset, options)


def _s3_sink(url: str, options: SourceOptions) -> Sink:
    return _s3_module(url).S3Sink(url, options)


register("s3", _open_s3, _s3_sink)
register("http", open_http)
register("https", open_http)
register("pipe", PipeSource, PipeSink)
