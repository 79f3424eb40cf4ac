"""DDP training on image shards with torchrun: every sample once, equal batches, elastic resume.

Run it as two "nodes" of two processes on one machine (gloo backend, CPU):

    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=0 --master_addr=127.0.0.1 --master_port=29500 \\
        examples/train_ddp.py --shards 'shards/train-{000000..000007}.tar' --workdir /tmp/ddp &
    torchrun --nnodes=2 --nproc_per_node=2 --node_rank=1 --master_addr=127.0.0.1 --master_port=29500 \\
        examples/train_ddp.py --shards 'shards/train-{000000..000007}.tar' --workdir /tmp/ddp

With ``--shards`` given several times, the datasets are mixed (``wdsx.Mix``) and the same
holds for every sample of every dataset.

Every ``--checkpoint-every`` steps all ranks gather their loader states into one checkpoint
(rank 0 writes it). Restarting with any number of ranks or workers resumes the epoch: the
samples not yet trained on are dealt to the new ranks and workers, each read exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wdsx


def samples(shards: str, seed: int) -> wdsx.DataPipeline:
    return (
        wdsx.WebDataset(shards, shardshuffle=True, detshuffle=True, seed=seed)
        .shuffle(100)
        .decode("torchl")
        .to_tuple("png;jpg", "cls", "__key__", "__pad__", missing_is_error=False)
    )


def build_loader(shards: list[str], batch_size: int, workers: int, seed: int) -> wdsx.WebLoader:
    """One dataset, or with several ``--shards`` a mixture of them (weights 3:2:1..., every
    sample of every dataset once per epoch)."""
    if len(shards) == 1:
        dataset = samples(shards[0], seed)
    else:
        weights = [len(shards) - k for k in range(len(shards))]
        dataset = wdsx.Mix([samples(pattern, seed) for pattern in shards], weights, stop="all", seed=seed)
    return wdsx.WebLoader(dataset.batched(batch_size), batch_size=None, num_workers=workers)


def save(path: str, payload: dict) -> None:
    temporary = path + ".partial"
    torch.save(payload, temporary)
    os.replace(temporary, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", required=True, action="append", help="repeat to mix datasets")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keys-dir", default=None, help="log each rank's batches here (tests)")
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(args.image_size**2, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = build_loader(args.shards, args.batch_size, args.workers, args.seed)
    os.makedirs(args.workdir, exist_ok=True)
    checkpoint = os.path.join(args.workdir, "checkpoint.pt")
    epoch, step = 0, 0
    if os.path.exists(checkpoint):
        saved = torch.load(checkpoint, weights_only=False)
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["loader"])
        epoch, step = saved["epoch"], saved["step"]
        if rank == 0:
            print(
                f"resumed at epoch {epoch}, step {step} on {world} ranks x {args.workers} workers", flush=True
            )
    log = None
    if args.keys_dir:
        os.makedirs(args.keys_dir, exist_ok=True)
        log = open(os.path.join(args.keys_dir, f"rank{rank}.log"), "a")  # noqa: SIM115 - closed below
    loss_fn = nn.CrossEntropyLoss()
    while epoch < args.epochs:
        batches = 0
        if log:
            log.write(json.dumps({"epoch_start": epoch, "len": len(loader)}) + "\n")
        for images, labels, keys, pads in loader:
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            batches += 1
            if log:
                log.write(
                    json.dumps(
                        {"epoch": epoch, "step": step, "keys": list(keys), "pads": [bool(p) for p in pads]}
                    )
                    + "\n"
                )
                log.flush()
            if step % args.checkpoint_every == 0:
                state = wdsx.gather_loader_state(loader)
                if rank == 0:
                    payload = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
                    save(checkpoint, {**payload, "loader": state, "epoch": epoch, "step": step})
            if args.step_delay:
                time.sleep(args.step_delay)
        epoch += 1
        if rank == 0:
            print(f"epoch {epoch - 1}: {batches} batches per rank", flush=True)
        if log:
            log.write(json.dumps({"epoch_end": epoch - 1, "batches": batches}) + "\n")
            log.flush()
    if log:
        log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
