"""Train with PyTorch Lightning from image shards; kill it at any point and resume exactly.

    python examples/train_lightning.py --shards 'data/shards/train-{000000..000003}.tar' \\
        --workdir /tmp/lightning --epochs 2

Run the same command again after a crash: ``fit(ckpt_path=last.ckpt)`` restores model,
optimizer, LR schedule and loader, and training continues with exactly the batches (and the
same random flips, drawn with ``wdsx.sample_rng``) an uninterrupted run would have seen.

``--log FILE`` appends one JSON line per training step (step, sample keys, sum of the images);
``--crash-after N`` kills the whole process group with SIGKILL once N steps are done (tests).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn

import wdsx
from wdsx.integrations.lightning import LoaderState


def flip(sample: dict) -> dict:
    """A random horizontal flip that depends on the sample alone (and the epoch)."""
    if wdsx.sample_rng(sample).random() < 0.5:
        sample["png"] = sample["png"].flip(-1)
    return sample


def build_loader(shards: str, batch_size: int, workers: int, seed: int) -> wdsx.WebLoader:
    dataset = (
        wdsx.WebDataset(shards, shardshuffle=True, detshuffle=True, seed=seed)
        .shuffle(100)
        .decode("torchl")
        .map(flip)
        .to_tuple("png", "cls", "__key__")
        .batched(batch_size)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


class Classifier(L.LightningModule):
    def __init__(self, size: int, log: str | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(size * size, 10))
        self.log_path = log

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, keys = batch
        if self.log_path:
            with open(self.log_path, "a") as stream:
                record = {"step": self.global_step, "keys": list(keys), "sum": float(images.sum())}
                stream.write(json.dumps(record) + "\n")
        return nn.functional.cross_entropy(self.net(images), labels)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        # Lightning counts the loader's batches for this before it reads the checkpoint
        # (Lightning #20550); LoaderState still resumes the loader.
        steps = int(self.trainer.estimated_stepping_batches)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class CrashAfter(Callback):
    """SIGKILL this process and its DataLoader workers once ``steps`` steps are done."""

    def __init__(self, steps: int):
        self.steps = steps

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.steps:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", default=None)
    parser.add_argument("--crash-after", type=int, default=None)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    resume = LoaderState()
    loader = resume.track(build_loader(args.shards, args.batch_size, args.workers, args.seed))
    checkpoints = ModelCheckpoint(
        dirpath=args.workdir, every_n_train_steps=args.checkpoint_every, save_top_k=0, save_last=True
    )
    callbacks: list[Callback] = [resume, checkpoints]
    if args.crash_after is not None:
        callbacks.append(CrashAfter(args.crash_after))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    last = os.path.join(args.workdir, "last.ckpt")
    model = Classifier(args.image_size, args.log)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=last if os.path.exists(last) else None)


if __name__ == "__main__":
    main()
