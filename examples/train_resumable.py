"""Train a tiny classifier on image shards, checkpointing model, optimizer and loader together.

Kill it at any point (even with SIGKILL) and run the same command again: it resumes from the
last checkpoint, and the samples it trains on after the restart are exactly the ones an
uninterrupted run would have trained on next.

    python examples/train_resumable.py --shards 'data/shards/train-{000000..000003}.tar' \\
        --workdir /tmp/run --epochs 2 --checkpoint-every 20

``--keys-log FILE`` records the keys of every batch trained on, one step per line; on resume the
lines after the checkpoint are dropped, so the file always describes what the model has seen.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn

import wdsx


def build_loader(shards: str, batch_size: int, workers: int, seed: int) -> wdsx.WebLoader:
    dataset = (
        wdsx.WebDataset(shards, shardshuffle=True, detshuffle=True, seed=seed)
        .shuffle(200)
        .decode("torchl")
        .to_tuple("png;jpg", "cls", "__key__")
        .batched(batch_size)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def build_model(size: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(size * size, 64), nn.ReLU(), nn.Linear(64, classes))


def save_checkpoint(
    path: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: wdsx.WebLoader,
    epoch: int,
    step: int,
) -> None:
    """Write the checkpoint under a temporary name and rename it: a crash leaves the old one."""
    temporary = path + ".partial"
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "loader": loader.state_dict(),
            "epoch": epoch,
            "step": step,
        },
        temporary,
    )
    os.replace(temporary, path)


def trim_log(path: str, steps: int) -> None:
    """Keep the first ``steps`` lines of the keys log: what the checkpointed model has seen."""
    if not os.path.exists(path):
        return
    with open(path) as stream:
        lines = stream.readlines()[:steps]
    with open(path, "w") as stream:
        stream.writelines(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keys-log", default=None)
    parser.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (demos)")
    args = parser.parse_args()

    os.makedirs(args.workdir, exist_ok=True)
    checkpoint = os.path.join(args.workdir, "checkpoint.pt")
    torch.manual_seed(args.seed)
    model = build_model(args.image_size, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = build_loader(args.shards, args.batch_size, args.workers, args.seed)
    epoch, step = 0, 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        epoch, step = saved["epoch"], saved["step"]
        print(f"resumed at epoch {epoch}, step {step}", flush=True)
    if args.keys_log:
        trim_log(args.keys_log, step)
    keys_log = open(args.keys_log, "a") if args.keys_log else None  # noqa: SIM115 - closed below
    loss_fn = nn.CrossEntropyLoss()
    started, samples = time.perf_counter(), 0
    while epoch < args.epochs:
        for images, labels, keys in loader:
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            samples += len(keys)
            if keys_log:
                keys_log.write(json.dumps(list(keys)) + "\n")
                keys_log.flush()
            if step % args.checkpoint_every == 0:
                save_checkpoint(checkpoint, model, optimizer, loader, epoch, step)
                print(f"epoch {epoch} step {step} loss {loss.item():.3f} (checkpoint saved)", flush=True)
            if args.step_delay:
                time.sleep(args.step_delay)
        epoch += 1
        save_checkpoint(checkpoint, model, optimizer, loader, epoch, step)
    elapsed = time.perf_counter() - started
    print(f"done: {step} steps, {samples / max(elapsed, 1e-9):.0f} samples/s in this run", flush=True)
    if keys_log:
        keys_log.close()


if __name__ == "__main__":
    main()
