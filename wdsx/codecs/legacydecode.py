"""Two pieces of webdataset's ``autodecode`` module that programs use directly: the function
behind ``handle_extension`` and the ``pytorch_weights_only`` switch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from wdsx.codecs.decode import ExtensionHandler, _weights_only


def call_extension_handler(
    key: str, data: bytes, f: Callable[[bytes], Any], extensions: Sequence[str]
) -> Any:
    """``f(data)`` if the field name ``key`` ends with one of ``extensions`` (multi-part ones
    such as ``"seg.png"`` included), else None."""
    decoder = ExtensionHandler(" ".join(extensions), f).decoder_for(key)
    return None if decoder is None else decoder(data)


def weights_only() -> bool:
    """Whether ``.pth`` fields are loaded with ``torch.load(weights_only=True)``: always,
    unless pickle is allowed (``WDSX_ALLOW_PICKLE=1``, outside secure mode) and
    ``WDS_PYTORCH_WEIGHTS_ONLY`` is not ``1``."""
    return _weights_only()
