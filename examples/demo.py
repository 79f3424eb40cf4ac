"""The whole wdsx story on the images shipped in ``data/``, in well under a minute.

1. convert an image folder (one sub-folder per class) into shards with a manifest;
2. check the shards;
3. stream them through a fluent pipeline and a 2-worker WebLoader while training a model;
4. checkpoint mid-epoch, "crash", resume from the checkpoint in a new loader, and show that
   the batches after the resume are exactly those of the uninterrupted run;
5. print throughput.
"""

from __future__ import annotations

import os
import shutil
import time

import torch
from torch import nn

import wdsx
from wdsx.commands import cli

ROOT = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SOURCE = os.path.join(ROOT, "data", "fashion-mnist-mini")
OUT = os.path.join(ROOT, "demo-out")
PATTERN = os.path.join(OUT, "shards", "fmnist-%06d.tar")


def loader(urls: list[str]) -> wdsx.WebLoader:
    dataset = (
        wdsx.WebDataset(urls, shardshuffle=True, detshuffle=True, seed=7)
        .shuffle(500)
        .decode("torchl")
        .to_tuple("png", "cls", "__key__")
        .batched(64)
    )
    return wdsx.WebLoader(dataset, batch_size=None, num_workers=2)


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, batches) -> list[list[str]]:
    seen = []
    for images, labels, keys in batches:
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen.append(list(keys))
    return seen


def main() -> None:
    shutil.rmtree(os.path.dirname(PATTERN), ignore_errors=True)  # its own shards, converted anew
    print("1. converting", os.path.relpath(SOURCE, ROOT), "into shards")
    started = time.perf_counter()
    cli.main(["convert", SOURCE, PATTERN, "--maxcount", "250", "--shuffle", "--workers", "2", "--quiet"])
    urls = sorted(
        os.path.join(os.path.dirname(PATTERN), f)
        for f in os.listdir(os.path.dirname(PATTERN))
        if f.endswith(".tar")
    )
    print(f"   {len(urls)} shards in {time.perf_counter() - started:.1f} s")

    print("2. checking them: wdsx verify")
    cli.main(["verify", *urls])

    print("3. training through WebLoader(num_workers=2), checkpointing at step 10")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = loader(urls)
    batches = iter(first)
    started = time.perf_counter()
    before = train_steps(model, optimizer, (next(batches) for _ in range(10)))
    checkpoint = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "loader": first.state_dict(),
    }
    rest = train_steps(model, optimizer, batches)
    elapsed = time.perf_counter() - started
    samples = sum(len(keys) for keys in before + rest)
    rate = samples / elapsed
    print(f"   epoch done: {len(before) + len(rest)} batches, {samples} samples, {rate:.0f} samples/s")
    print(f"   the loader checkpoint is {len(str(checkpoint['loader']))} bytes of JSON-able state")

    print("4. 'crash' after step 10: a new model and loader resume from the checkpoint")
    model = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, 10))
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer.load_state_dict(checkpoint["optimizer"])
    resumed = loader(urls)
    resumed.load_state_dict(checkpoint["loader"])
    again = train_steps(model, optimizer, resumed)
    exact = again == rest
    print(f"   {len(again)} batches after the resume; identical to the uninterrupted run: {exact}")
    trained = [key for keys in before + again for key in keys]
    print(f"   every sample once: {len(trained) == len(set(trained)) == samples}")
    if not exact:
        raise SystemExit("resume was not exact")


if __name__ == "__main__":
    main()
