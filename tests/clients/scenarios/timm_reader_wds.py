"""timm's webdataset reader (timm 1.0.31, ``timm.data.readers.reader_wds``): the dataset made by
``timm.data.create_dataset("wds/...")`` and loaded as ``timm.data.create_loader`` loads an
iterable dataset (``set_loader_cfg``, timm's worker init, ``drop_last`` when training), each
epoch started as timm's train.py starts it (``set_epoch``). The image transform is the
program's own; timm's would need torchvision's transforms (see the torchvision stand-in).
"""

import json
import multiprocessing
import os
from functools import partial

import scenario_io
import torch
from timm.data import create_dataset
from timm.data.loader import _worker_init
from torch.utils.data.dataloader import default_collate


def write_info(root: str, shards: str) -> None:
    """The dataset description timm's reader looks for (``_info.json``), naming the shards."""
    splits = {
        "train": ("train", [4] * 8),
        "validation": ("val", [3, 4, 2, 5]),
    }
    info = {"name": "clients", "splits": {}}
    for split, (prefix, lengths) in splits.items():
        info["splits"][split] = {
            "name": split,
            "num_samples": sum(lengths),
            "filenames": [os.path.join(shards, f"{prefix}-{n:04d}.tar") for n in range(len(lengths))],
            "shard_lengths": lengths,
        }
    with open(os.path.join(root, "_info.json"), "w") as stream:
        json.dump(info, stream)


def main() -> None:
    options = scenario_io.parse()
    if options.start_method:
        # timm's shared epoch counter is made in the default context: set it program-wide.
        multiprocessing.set_start_method(options.start_method)
    train = options.path == "train"
    root = os.path.dirname(os.path.abspath(options.out))
    write_info(root, options.shards)
    torch.manual_seed(0)
    dataset = create_dataset(
        "wds/clients",
        root=root,
        split="train" if train else "validation",
        is_training=train,
        batch_size=4,
        seed=42,
    )
    dataset.transform = scenario_io.to_tensor
    dataset.set_loader_cfg(num_workers=options.workers)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=4,
        shuffle=False,
        num_workers=options.workers,
        collate_fn=default_collate,
        worker_init_fn=partial(_worker_init, worker_seeding="all"),
        persistent_workers=options.workers > 0,
        drop_last=train,
    )
    epochs = []
    for epoch in range(options.epochs):
        if train:
            dataset.set_epoch(epoch)
        epochs.append(list(loader))
    scenario_io.save(options.out, epochs, options.workers)


if __name__ == "__main__":
    main()
