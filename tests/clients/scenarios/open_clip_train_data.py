"""open_clip's training data (open_clip_torch 3.3.0, ``open_clip_train.data``): ``get_data``
sets up the training or the validation loader as ``open_clip_train.main`` does, and each epoch
is iterated as its training loop and its evaluation run it (the training loop first calls
``set_epoch``). The model and its tokenizer are the program's own: here the shared transforms.
"""

import argparse
import os

import scenario_io
import torch
from open_clip_train.data import get_data


def main() -> None:
    options = scenario_io.parse()
    train = options.path == "train"
    train_data = os.path.join(options.shards, "train-{0000..0007}.tar")
    val_data = os.path.join(options.shards, "val-{0000..0003}.tar")
    args = argparse.Namespace(
        train_data=train_data if train else None,
        val_data=None if train else val_data,
        dataset_type="webdataset",
        train_num_samples=32,
        val_num_samples=None,
        dataset_resampled=False,
        train_data_upsampling_factors=None,
        seed=0,
        batch_size=4,
        workers=options.workers,
        world_size=1,
        imagenet_val=None,
        imagenet_v2=None,
    )
    torch.manual_seed(0)
    data = get_data(
        args, (scenario_io.to_tensor, scenario_io.to_tensor), epoch=0, tokenizer=scenario_io.tokenize
    )
    epochs = []
    for epoch in range(options.epochs):
        if train:
            data["train"].set_epoch(epoch)
        epochs.append(list(data[options.path].dataloader))
    scenario_io.save(options.out, epochs, options.workers)


if __name__ == "__main__":
    main()
