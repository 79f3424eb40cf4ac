"""PyTorch Lightning: checkpoints that resume a WebLoader exactly where the model left off.

    resume = LoaderState()
    trainer = lightning.Trainer(callbacks=[resume, ModelCheckpoint(every_n_train_steps=100)])
    trainer.fit(model, train_dataloaders=resume.track(loader), ckpt_path="last")

Handing the WebLoader to Lightning as it is would lose batches on resume: Lightning calls
``state_dict()`` on loaders that have one, but it fetches a batch before training on the
previous one, so the loader's state is one batch ahead of the checkpointed model. And when
``configure_optimizers`` asks for ``trainer.estimated_stepping_batches``, Lightning starts the
loader before it reads the checkpoint and never gives it the saved state (Lightning #20550).

:class:`LoaderState` fixes both: :meth:`LoaderState.track` wraps the loader so that its state is
the one after the batches trained on (:class:`~wdsx.integrations.tracking.TrackedLoader`), and
the callback, which Lightning restores before it starts any loader, carries those states in
the checkpoint and hands them to the loaders. The wrapped loader keeps ``state_dict()`` too
(with the same state), so Lightning knows it is resumable.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from wdsx.integrations.tracking import TrackedLoader
from wdsx.loader.webloader import WebLoader
from wdsx.state.checkpoint import JsonDict


class LoaderState(Callback):
    """Keeps the state of the training loaders made with :meth:`track` in Lightning's
    checkpoints, as of the last batch trained on, and restores it on ``fit(ckpt_path=...)``.

    Each training step is taken to use one batch of every tracked loader that Lightning is
    training from. Under DDP, saving gathers every rank's state into the checkpoint (all ranks
    take part in a Lightning checkpoint), so it resumes on any number of ranks and workers.
    """

    def __init__(self) -> None:
        self.loaders: dict[str, TrackedLoader] = {}
        self._restored: dict[str, JsonDict] = {}

    def track(self, loader: WebLoader, name: str = "train") -> TrackedLoader:
        """``loader`` wrapped for Lightning; pass the result as a training dataloader.
        ``name`` tells the loaders of one trainer apart in checkpoints."""
        tracked = TrackedLoader(loader)
        if name in self._restored:
            tracked.load_state_dict(self._restored.pop(name))
        self.loaders[name] = tracked
        return tracked

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        training = {id(iterable) for iterable in _leaves(trainer.train_dataloader)}
        for tracked in self.loaders.values():
            if id(tracked) in training:
                tracked.used()

    def state_dict(self) -> dict[str, Any]:
        return {name: tracked.state_dict() for name, tracked in self.loaders.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, state in state_dict.items():
            if name in self.loaders:
                self.loaders[name].load_state_dict(state)
            else:
                self._restored[name] = state


def _leaves(iterables: Any) -> Iterator[Any]:
    """The loaders in Lightning's ``train_dataloader`` (one, or a list or dict of them)."""
    if isinstance(iterables, dict):
        iterables = list(iterables.values())
    if isinstance(iterables, (list, tuple)):
        for item in iterables:
            yield from _leaves(item)
    elif iterables is not None:
        yield iterables
