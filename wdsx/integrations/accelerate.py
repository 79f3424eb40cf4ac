"""Hugging Face Accelerate: a WebLoader that Accelerate neither re-shards nor forgets.

    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)
    ...
    accelerator.save_state(path)   # includes every rank's loader state
    accelerator.load_state(path)   # in a new job: the loader continues where it stopped

``accelerator.prepare`` shards a torch ``DataLoader`` over an iterable dataset across
processes once more (each process keeps one batch in N, or the main process reads and deals
batches out): over a wdsx dataset, which every rank already reads its own share of, that drops
(N-1)/N of the data without a word (accelerate #3547). A ``WebLoader`` is not a torch
``DataLoader``, so ``accelerator.prepare`` hands it back untouched: nothing is dropped, but
batches stay on the CPU and ``save_state`` leaves the loader out.

:func:`prepare` is ``accelerator.prepare`` for everything else; a WebLoader comes back as an
:class:`AcceleratedLoader` (batches moved to ``accelerator.device``, the loader registered for
``save_state``/``load_state``), and a torch DataLoader over a wdsx dataset is refused, saying
what to use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from accelerate import Accelerator
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader

from wdsx.loader.webloader import WebLoader, gather_loader_state
from wdsx.pipeline.datapipeline import DataPipeline
from wdsx.state.checkpoint import JsonDict


class AcceleratedLoader:
    """``loader``'s batches on ``accelerator``'s device, with a state that covers every rank
    (``state_dict()`` is a collective: Accelerate calls it on every process in ``save_state``)."""

    def __init__(self, loader: WebLoader, accelerator: Accelerator):
        self.loader = loader
        self.device = accelerator.device
        self.non_blocking = accelerator.non_blocking

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield send_to_device(batch, self.device, non_blocking=self.non_blocking)

    def state_dict(self) -> JsonDict:
        return gather_loader_state(self.loader)

    def load_state_dict(self, state: JsonDict) -> None:
        self.loader.load_state_dict(state)


def prepare(accelerator: Accelerator, *objects: Any) -> Any:
    """``accelerator.prepare(*objects)``, except that WebLoaders become :class:`AcceleratedLoader`
    (registered with ``accelerator.register_for_checkpointing``). Returns the prepared objects
    in order, a single object when given one, as Accelerate does.

    Raises ``ValueError`` for a torch ``DataLoader`` over a wdsx dataset (Accelerate would
    shard it again and drop data): wrap the dataset in ``wdsx.WebLoader`` instead.
    """
    results: list[Any] = list(objects)
    others = []
    for index, obj in enumerate(objects):
        if isinstance(obj, WebLoader):
            results[index] = AcceleratedLoader(obj, accelerator)
            accelerator.register_for_checkpointing(results[index])
        elif _reads_wdsx(obj):
            raise ValueError(
                "a torch DataLoader over a wdsx dataset: Accelerate would shard its batches across "
                "processes again and drop data that wdsx already dealt to each rank; pass "
                "wdsx.WebLoader(dataset, batch_size=..., num_workers=...) instead"
            )
        else:
            others.append(index)
    if others:
        prepared = accelerator.prepare(*(objects[index] for index in others))
        for index, obj in zip(others, prepared if len(others) > 1 else [prepared]):
            results[index] = obj
    return results[0] if len(results) == 1 else tuple(results)


def _reads_wdsx(obj: Any) -> bool:
    """True for a torch DataLoader whose dataset is a wdsx pipeline, directly or inside
    Accelerate's own ``IterableDatasetShard``."""
    if not isinstance(obj, DataLoader):
        return False
    dataset = obj.dataset
    return isinstance(dataset, DataPipeline) or isinstance(getattr(dataset, "dataset", None), DataPipeline)
