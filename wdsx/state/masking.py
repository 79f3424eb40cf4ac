"""Checkpoints that hold no credentials.

A shard URL may carry what grants access to its shard: ``user:password@``, a presigned query
(:mod:`wdsx.core.redact`). A checkpoint names shards, in its URL table and in its record of
the data, and checkpoints are saved, copied and shared; so every URL in one is written masked,
as messages show it, and the pipeline that loads it puts its own URLs back: a masked URL
stands for the one of the pipeline's shards that masks to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from wdsx.core.redact import redact
from wdsx.state.checkpoint import FORMAT, JsonDict, PipelineState


def masked(state: Any) -> Any:
    """``state`` (a checkpoint's JSON) with the URLs of its own and of every checkpoint nested
    in it (a loader's workers', a mixture's sources') masked; nothing else changes."""
    if isinstance(state, list):
        return [masked(item) for item in state]
    if not isinstance(state, dict):
        return state
    copied = {key: masked(value) for key, value in state.items()}
    if state.get("format") == FORMAT:
        if isinstance(copied.get("urls"), list):
            copied["urls"] = [redact(url) if isinstance(url, str) else url for url in copied["urls"]]
        data = copied.get("data")
        if isinstance(data, dict) and isinstance(data.get("shards"), list):
            copied["data"] = {**data, "shards": [_masked_entry(entry) for entry in data["shards"]]}
    return copied


def _masked_entry(entry: Any) -> Any:
    """A shard's record (``[url, size, sha256]``) with its URL masked."""
    if isinstance(entry, list) and entry and isinstance(entry[0], str):
        return [redact(entry[0]), *entry[1:]]
    return entry


def unmasked(state: PipelineState, urls: Iterable[str]) -> PipelineState:
    """``state`` (parsed) with each masked URL in it replaced by the one of ``urls`` (the
    pipeline's shards) that masks to it; a URL that masks to itself, or that none of ``urls``
    masks to, stays as it is."""
    url_of = _unmasker(urls)
    state.urls = [url_of(url) for url in state.urls]
    data = state.data
    if data is not None and isinstance(data.get("shards"), list):
        state.data = {**data, "shards": [_unmasked_entry(entry, url_of) for entry in data["shards"]]}
    return state


def _unmasked_entry(entry: Any, url_of: Callable[[str], str]) -> Any:
    if isinstance(entry, list) and entry and isinstance(entry[0], str):
        return [url_of(entry[0]), *entry[1:]]
    return entry


def _unmasker(urls: Iterable[str]) -> Callable[[str], str]:
    known: JsonDict = {}
    for url in urls:
        shown = redact(url)
        if shown != url:
            known.setdefault(shown, url)
    return lambda url: known.get(url, url)
