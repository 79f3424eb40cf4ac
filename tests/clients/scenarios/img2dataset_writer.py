"""img2dataset's shard writer (img2dataset 1.47.0, ``img2dataset.writer.WebDatasetSampleWriter``):
the samples of the test's validation shards (read with tarfile) written as img2dataset's
downloader writes what it fetched: image, caption and metadata per key, one shard. The
"batches" recorded are the written tar's members as Python's tarfile reads them, without
their modification times (each library stamps the time of writing). img2dataset's package
``__init__`` imports its downloader and its dependencies, so the writer's module is imported
without it.
"""

import os
import tarfile

import pyarrow as pa
import scenario_io

writer = scenario_io.import_module_without_package_init("img2dataset.writer")


def source_samples(shards: str) -> list[tuple[str, bytes, str]]:
    """(key, image bytes, caption) of every validation sample, in shard order."""
    samples = []
    for shard in range(4):
        with tarfile.open(os.path.join(shards, f"val-{shard:04d}.tar")) as archive:
            members = {member.name: archive.extractfile(member).read() for member in archive}
        for name in members:
            key, extension = name.split(".", 1)
            if extension == "jpg":
                samples.append((key, members[name], members[f"{key}.txt"].decode()))
    return samples


def main() -> None:
    options = scenario_io.parse()
    folder = os.path.dirname(os.path.abspath(options.out))
    schema = pa.schema([pa.field("key", pa.string()), pa.field("caption", pa.string())])
    sink = writer.WebDatasetSampleWriter(0, folder, True, 5, schema, "jpg")
    for key, image, caption in source_samples(options.shards):
        sink.write(image, key, caption, {"key": key, "caption": caption})
    sink.close()
    with tarfile.open(os.path.join(folder, "00000.tar")) as archive:
        members = [
            {
                "name": member.name,
                "type": member.type,
                "mode": member.mode,
                "owner": (member.uid, member.gid, member.uname, member.gname),
                "data": archive.extractfile(member).read(),
            }
            for member in archive
        ]
    scenario_io.save(options.out, [members])


if __name__ == "__main__":
    main()
