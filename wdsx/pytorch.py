"""webdataset's ``pytorch`` module: torch's ``IterableDataset``, ``DataLoader`` and ``Tensor``
(as ``TorchTensor``), imported only when one of them is used, so ``import wdsx`` stays
torch-free. Without torch, stand-in classes let code subclass them, as in webdataset."""

from __future__ import annotations

import importlib
from typing import Any

_TORCH_NAMES = {
    "IterableDataset": ("torch.utils.data", "IterableDataset"),
    "DataLoader": ("torch.utils.data", "DataLoader"),
    "TorchTensor": ("torch", "Tensor"),
}


def __getattr__(name: str) -> Any:
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _TORCH_NAMES[name]
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except ModuleNotFoundError:
        value = type(name, (), {"__doc__": f"Stand-in for torch's {attribute} (torch is not installed)."})
    globals()[name] = value
    return value


__all__ = list(_TORCH_NAMES)
