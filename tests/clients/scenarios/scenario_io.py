"""What the scenario programs share: their command line, the transforms they hand the
client (the part of a training program that is the user's own), and how they record batches.

A scenario is a small program that sets up a client's data loading as the client's own
training or inference entry point does, then iterates it. The test runs it twice, with the
same arguments: once on the webdataset release the client pins, once with ``webdataset``
resolving to wdsx; it compares what the two runs recorded.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import PIL.Image
import torch

TOKENS = 32


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", required=True, help="the folder the test wrote the shards in")
    parser.add_argument("--path", required=True, help="which of the client's paths to run")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--start-method", help="how DataLoader workers start (default: fork)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", required=True, help="where to pickle the recorded batches")
    return parser.parse_args()


def to_tensor(image: PIL.Image.Image) -> torch.Tensor:
    """The image transform: a fixed-size float tensor, channels first."""
    array = np.asarray(image.convert("RGB").resize((8, 8), PIL.Image.NEAREST), dtype=np.float32)
    return torch.from_numpy(array / 255.0).permute(2, 0, 1).contiguous()


def tokenize(texts: str | list[str]) -> torch.Tensor:
    """The tokenizer: one row of character codes per text, padded to ``TOKENS``."""
    if isinstance(texts, str):
        texts = [texts]
    rows = torch.zeros(len(texts), TOKENS, dtype=torch.long)
    for row, text in enumerate(texts):
        codes = [ord(character) for character in text[:TOKENS]]
        rows[row, : len(codes)] = torch.tensor(codes)
    return rows


def import_module_without_package_init(name: str) -> types.ModuleType:
    """Import the module ``name`` of an installed package without running the ``__init__``
    of the packages above it.

    Some clients' top-level ``__init__`` imports the whole library (models, servers, and
    their dependencies, which cannot be installed next to this virtualenv's torch). Their
    data-loading modules import only what they use, so the packages above them are entered
    as plain namespaces; the modules themselves run unchanged.
    """
    parts = name.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package in sys.modules:
            continue
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            raise ImportError(f"{package} is not an installed package")
        namespace = types.ModuleType(package)
        namespace.__path__ = list(spec.submodule_search_locations)
        sys.modules[package] = namespace
    return importlib.import_module(name)


def plain(value: Any) -> Any:
    """Batches as plain, picklable values: tensors become numpy arrays."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


class _WhichWebdataset(torch.utils.data.IterableDataset):
    """Yields, from a worker process, the file ``import webdataset`` gives there."""

    def __iter__(self) -> Iterator[str | None]:
        yield importlib.import_module("webdataset").__file__


def workers_webdataset(workers: int) -> list[str | None]:
    """Which webdataset ``import webdataset`` gives the program's DataLoader workers
    (started as the program starts its own)."""
    if workers == 0:
        return []
    loader = torch.utils.data.DataLoader(_WhichWebdataset(), batch_size=None, num_workers=workers)
    return list(loader)


def save(out: str, epochs: list[list[Any]], workers: int = 0) -> None:
    """Record each epoch's batches, and which webdataset the program and its ``workers``
    DataLoader workers ran on."""
    webdataset = sys.modules.get("webdataset")
    record = {
        "webdataset": getattr(webdataset, "__file__", None),
        "workers_webdataset": workers_webdataset(workers),
        "epochs": [[plain(batch) for batch in batches] for batches in epochs],
    }
    with open(out, "wb") as stream:
        pickle.dump(record, stream)
