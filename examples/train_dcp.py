"""DDP training that checkpoints model and loader with torch.distributed.checkpoint (DCP).

    torchrun --nproc_per_node=2 examples/train_dcp.py --shards 'shards/train-{000000..000007}.tar' \\
        --workdir /tmp/dcp

Every ``--checkpoint-every`` steps, ``dcp.save`` writes the model and every rank's loader state
(``wdsx.integrations.dcp.LoaderStateful``) to ``WORKDIR/step-N``. Run the same command after a
crash: the job loads the newest complete checkpoint and each rank continues with exactly the
batches it would have trained on next (on another number of ranks, the rest of the epoch is
re-dealt). ``--log-dir`` logs each rank's batches; ``--crash-after N`` kills the job with
SIGKILL once N steps are done (tests).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wdsx
from wdsx.integrations.dcp import LoaderStateful


def build_loader(shards: str, batch_size: int, workers: int, seed: int) -> wdsx.WebLoader:
    dataset = (
        wdsx.WebDataset(shards, shardshuffle=True, detshuffle=True, seed=seed)
        .shuffle(50)
        .decode("torchl")
        .to_tuple("png", "cls", "__key__")
        .batched(batch_size)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


def newest_checkpoint(workdir: str) -> str | None:
    """The last checkpoint DCP finished (it writes ``.metadata`` last)."""
    done = sorted(glob.glob(os.path.join(workdir, "step-*", ".metadata")))
    return os.path.dirname(done[-1]) if done else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--crash-after", type=int, default=None)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(nn.Sequential(nn.Flatten(), nn.Linear(args.image_size**2, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = build_loader(args.shards, args.batch_size, args.workers, args.seed)
    state: dict[str, Any] = {"model": model, "loader": LoaderStateful(loader), "epoch": 0, "step": 0}
    if (checkpoint := newest_checkpoint(args.workdir)) is not None:
        dcp.load(state, checkpoint_id=checkpoint)
    epoch, step = state["epoch"], state["step"]
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    log = os.path.join(args.log_dir, f"rank{rank}.jsonl") if args.log_dir else None
    while epoch < args.epochs:
        for images, labels, keys in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if log:
                with open(log, "a") as stream:
                    stream.write(json.dumps({"step": step, "keys": list(keys)}) + "\n")
            step += 1
            if step % args.checkpoint_every == 0:
                state.update(epoch=epoch, step=step)
                dcp.save(state, checkpoint_id=os.path.join(args.workdir, f"step-{step:06d}"))
            if step == args.crash_after:
                os.killpg(os.getpgid(0), signal.SIGKILL)
        epoch += 1
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
