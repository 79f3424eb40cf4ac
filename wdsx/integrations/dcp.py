"""``torch.distributed.checkpoint`` (DCP): a ``Stateful`` that carries every rank's loader state.

    dcp.save({"model": model_state, "loader": LoaderStateful(loader)}, checkpoint_id=path)
    dcp.load({"model": model_state, "loader": LoaderStateful(loader)}, checkpoint_id=path)

A WebLoader has ``state_dict()``/``load_state_dict()`` itself, so DCP would take it as a
``Stateful`` as it is; but DCP keeps one copy of each non-tensor entry, so only one rank's
state would survive (and its nested dicts would be flattened into many entries). The wrapper
gathers every rank's state into one global state (:func:`wdsx.gather_loader_state`), stored as
one JSON string that every rank saves alike and ``torch.load`` reads with ``weights_only``. On
load, each rank takes its part, or a share re-dealt to the new number of ranks and workers.
"""

from __future__ import annotations

import json

from wdsx.loader.webloader import WebLoader, gather_loader_state


class LoaderStateful:
    """A ``torch.distributed.checkpoint.stateful.Stateful`` for ``loader``. Saving is a
    collective under ``torch.distributed`` (every rank calls ``dcp.save``, as DCP requires)."""

    key = "wdsx_loader_state"
    """The one entry of this object's state dict: the gathered state as JSON text."""

    def __init__(self, loader: WebLoader):
        self.loader = loader

    def state_dict(self) -> dict[str, str]:
        return {self.key: json.dumps(gather_loader_state(self.loader))}

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        self.loader.load_state_dict(json.loads(state_dict[self.key]))
