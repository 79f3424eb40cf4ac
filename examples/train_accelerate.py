"""Training with Hugging Face Accelerate from image shards: every sample once, exact resume.

    accelerate launch --num_processes 2 examples/train_accelerate.py \\
        --shards 'shards/train-{000000..000007}.tar' --workdir /tmp/accelerate

(``torchrun --nproc_per_node=2`` works too.) ``wdsx.integrations.accelerate.prepare`` is
``accelerator.prepare`` except for the WebLoader, which Accelerate would otherwise leave on the
CPU and out of ``save_state``; a torch DataLoader over a wdsx dataset would be sharded a second
time by Accelerate and lose data, and ``prepare`` refuses it. Every ``--checkpoint-every`` steps
``accelerator.save_state`` writes ``WORKDIR/step-N``; run the same command after a crash and
training continues with exactly the batches it would have seen next. ``--log-dir`` logs each
process's batches; ``--crash-after N`` kills the job with SIGKILL once N steps are done (tests).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal

import torch
from accelerate import Accelerator
from torch import nn

import wdsx
from wdsx.integrations.accelerate import prepare


def build_loader(shards: str, batch_size: int, workers: int, seed: int) -> wdsx.WebLoader:
    dataset = (
        wdsx.WebDataset(shards, shardshuffle=True, detshuffle=True, seed=seed)
        .shuffle(50)
        .decode("torchl")
        .to_tuple("png", "cls", "__key__")
        .batched(batch_size)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=workers)


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
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even with a GPU")
    parser.add_argument("--log-dir", default=None)
    parser.add_argument("--crash-after", type=int, default=None)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=args.cpu)
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(args.image_size**2, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = build_loader(args.shards, args.batch_size, args.workers, args.seed)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader)
    epoch, step = 0, 0
    saved = sorted(glob.glob(os.path.join(args.workdir, "step-*", "progress.json")))
    if saved:
        accelerator.load_state(os.path.dirname(saved[-1]))
        with open(saved[-1]) as stream:
            epoch, step = json.load(stream)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    log = os.path.join(args.log_dir, f"rank{accelerator.process_index}.jsonl") if args.log_dir else None
    while epoch < args.epochs:
        for images, labels, keys in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            if log:
                with open(log, "a") as stream:
                    stream.write(json.dumps({"step": step, "keys": list(keys)}) + "\n")
            step += 1
            if step % args.checkpoint_every == 0:
                directory = os.path.join(args.workdir, f"step-{step:06d}")
                accelerator.save_state(directory)
                accelerator.wait_for_everyone()
                if accelerator.is_main_process:  # written last: marks the checkpoint complete
                    with open(os.path.join(directory, "progress.json"), "w") as stream:
                        json.dump([epoch, step], stream)
            if step == args.crash_after:
                os.killpg(os.getpgid(0), signal.SIGKILL)
        epoch += 1
    accelerator.end_training()


if __name__ == "__main__":
    main()
