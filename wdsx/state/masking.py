"""Checkpoints that hold no credentials.

A shard URL may carry what grants access to its shard: ``user:password@``, a presigned query,
a URL inside a ``pipe:`` command (:mod:`wdsx.core.redact`). A checkpoint names shards, in its
URL tables and in its record of the data, and checkpoints are saved, copied and shared; so a
URL in one is written masked, as messages show it, and the pipeline that loads it puts its
own URL back. That needs a masked URL to stand for exactly one of the pipeline's shards: a URL
whose masked form another shard's URL shares, or is, is written as it is.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from wdsx.core.redact import redact_text
from wdsx.state.checkpoint import FORMAT, PipelineState


class UrlMasks:
    """How the shard URLs of one pipeline appear in its checkpoints, and back."""

    def __init__(self, urls: Iterable[str]):
        known = set(urls)
        shown = {url: redact_text(url) for url in known}
        uses = Counter(shown.values())
        self._shown = {
            url: text for url, text in shown.items() if text != url and uses[text] == 1 and text not in known
        }
        self._real = {text: url for url, text in self._shown.items()}

    def mask(self, url: str) -> str:
        """``url`` as checkpoints show it."""
        return self._shown.get(url, url)

    def unmask(self, url: str) -> str:
        """The shard URL that ``url``, as a checkpoint shows it, stands for."""
        return self._real.get(url, url)

    def masked(self, state: Any) -> Any:
        """``state`` (a checkpoint's JSON) with the URLs of its own and of every checkpoint
        nested in its stages' states (a loader's workers', a mixture's sources') masked."""
        if not self._shown or not isinstance(state, dict) or state.get("format") != FORMAT:
            return state  # (most pipelines' URLs hold no credentials: nothing to copy)
        copied = dict(state)
        if isinstance(state.get("urls"), list):
            copied["urls"] = [self.mask(url) if isinstance(url, str) else url for url in state["urls"]]
        data = state.get("data")
        if isinstance(data, dict) and isinstance(data.get("shards"), list):
            copied["data"] = {**data, "shards": [self._entry(entry, self.mask) for entry in data["shards"]]}
        if isinstance(state.get("stages"), dict):
            copied["stages"] = {key: self._nested(value) for key, value in state["stages"].items()}
        return copied

    def unmasked(self, state: PipelineState) -> PipelineState:
        """``state`` (parsed) with its shard URLs as the pipeline has them (nested states are
        put back as they are parsed, each by its own pipeline)."""
        if not self._real:
            return state
        state.urls = [self.unmask(url) for url in state.urls]
        data = state.data
        if data is not None and isinstance(data.get("shards"), list):
            state.data = {**data, "shards": [self._entry(entry, self.unmask) for entry in data["shards"]]}
        return state

    def _nested(self, value: Any) -> Any:
        """A stage's state with the checkpoints inside it masked."""
        if isinstance(value, dict):
            if value.get("format") == FORMAT:
                return self.masked(value)
            return {key: self._nested(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._nested(item) for item in value]
        return value

    @staticmethod
    def _entry(entry: Any, convert: Any) -> Any:
        """A shard's record (``[url, size, sha256]``) with its URL converted."""
        if isinstance(entry, list) and entry and isinstance(entry[0], str):
            return [convert(entry[0]), *entry[1:]]
        return entry
