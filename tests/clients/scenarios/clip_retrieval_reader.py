"""clip-retrieval's inference reader (clip-retrieval 2.45.0,
``clip_retrieval.clip_inference.reader.WebdatasetReader``), built and iterated as
``clip_inference``'s runner does for one output partition. clip_retrieval's package
``__init__`` imports its servers and index builders, so the reader's module is imported
without it (see scenario_io.import_module_without_package_init).
"""

import os

import scenario_io

reader = scenario_io.import_module_without_package_init("clip_retrieval.clip_inference.reader")
runner = scenario_io.import_module_without_package_init("clip_retrieval.clip_inference.runner")


def main() -> None:
    options = scenario_io.parse()
    urls = [os.path.join(options.shards, f"val-{n:04d}.tar") for n in range(4)]
    epochs = []
    for _ in range(options.epochs):
        batches = reader.WebdatasetReader(
            runner.Sampler(0, 1),
            scenario_io.to_tensor,
            scenario_io.tokenize,
            urls,
            batch_size=4,
            num_prepro_workers=options.workers,
            enable_text=True,
            enable_image=True,
            enable_metadata=True,
        )
        epochs.append(list(batches))
    scenario_io.save(options.out, epochs, options.workers)


if __name__ == "__main__":
    main()
