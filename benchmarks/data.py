"""Benchmark shards, generated once under ``bench-out/`` and reused: the same files for wdsx
and webdataset in every run."""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import PIL.Image

ROOT = os.environ.get("WDSX_BENCH_DIR", os.path.join(os.path.dirname(__file__), "..", "bench-out"))


def _write(path: str, samples) -> None:
    temporary = path + ".partial"
    with tarfile.open(temporary, "w") as archive:
        for key, fields in samples:
            for ext, data in fields:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    os.replace(temporary, path)


def _shard_set(name: str, nshards: int, per_shard: int, make_fields) -> list[str]:
    directory = os.path.join(ROOT, name)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for shard in range(nshards):
        path = os.path.join(directory, f"{name}-{shard:06d}.tar")
        if not os.path.exists(path):
            keys = range(shard * per_shard, (shard + 1) * per_shard)
            _write(path, ((f"{name}{i:08d}", make_fields(i)) for i in keys))
        paths.append(path)
    return paths


def tiny_shards(samples: int = 100_000, nshards: int = 10) -> list[str]:
    """Samples of a ~100-byte text field and a one-byte class."""
    rng = np.random.default_rng(1)
    texts = [rng.integers(97, 123, 100, dtype=np.uint8).tobytes() for _ in range(1000)]
    return _shard_set(
        "tiny", nshards, samples // nshards, lambda i: [("cls", b"%d" % (i % 10)), ("txt", texts[i % 1000])]
    )


def jpeg_pool(count: int = 400) -> list[bytes]:
    """Distinct 256x256 JPEGs of about 24 KB (textured gradients)."""
    rng = np.random.default_rng(2)
    y, x = np.mgrid[0:256, 0:256]
    pool = []
    for i in range(count):
        base = np.stack(
            [(x * (1 + i % 3) + y) % 256, (y * 2 + i * 10) % 256, ((x + y) // 2 + i * 30) % 256], -1
        )
        image = np.clip(base + rng.normal(0, 22, base.shape), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        PIL.Image.fromarray(image).save(out, format="JPEG", quality=75)
        pool.append(out.getvalue())
    return pool


def jpeg_shards(samples: int = 20_000, nshards: int = 20, name: str = "jpeg") -> list[str]:
    """Samples of a ~24 KB JPEG and a class."""
    pool: list[bytes] = []

    def fields(i: int) -> list[tuple[str, bytes]]:
        if not pool:
            pool.extend(jpeg_pool())
        return [("cls", b"%d" % (i % 10)), ("jpg", pool[i % len(pool)])]

    return _shard_set(name, nshards, samples // nshards, fields)


def big_shard(samples: int = 20_000) -> str:
    """One ~500 MB shard, for resume latency at different depths."""
    return jpeg_shards(samples, 1, name="big")[0]
