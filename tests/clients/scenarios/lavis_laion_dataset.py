"""LAVIS's LAION dataset (salesforce-lavis 1.0.2, ``lavis.datasets.datasets.laion_dataset``):
``LaionDataset(...).inner_dataset`` loaded as LAVIS's ``RunnerBase.create_loaders`` loads a
``wds.DataPipeline``, and its first batches taken as an iteration-based training loop takes
them. The dataset resamples shards forever and shuffles without a seed, so only its batch
structure and the samples' integrity can be compared. lavis's package ``__init__`` imports
every model (transformers and more), so the dataset's module is imported without it.
"""

import os

import scenario_io
from torch.utils.data import DataLoader

laion = scenario_io.import_module_without_package_init("lavis.datasets.datasets.laion_dataset")

BATCHES = 10


def main() -> None:
    options = scenario_io.parse()
    dataset = laion.LaionDataset(
        vis_processor=scenario_io.to_tensor,
        text_processor=str.upper,
        location=os.path.join(options.shards, "train-{0000..0007}.tar"),
    )
    loader = iter(
        DataLoader(dataset.inner_dataset, batch_size=4, num_workers=options.workers, pin_memory=True)
    )
    epochs = [[next(loader) for _ in range(BATCHES)] for _ in range(options.epochs)]
    scenario_io.save(options.out, epochs, options.workers)


if __name__ == "__main__":
    main()
