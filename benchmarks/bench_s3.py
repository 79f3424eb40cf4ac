"""Read throughput of shards stored in S3 (a local SeaweedFS): wdsx against ``pipe:aws s3 cp``.

``bench_s3(shard_paths)`` uploads the given shards to a fresh bucket on a SeaweedFS server it
starts itself, then streams every shard back to the end, ``runs`` times per method:

- ``wdsx``: :func:`wdsx.sources.open_source` on ``s3://`` URLs, one shard after the other;
- ``wdsx+prefetch1`` / ``wdsx+prefetch4``: the same through a
  :class:`~wdsx.sources.prefetch.Prefetcher` that opens the next 1 (or 4) shards while the
  current one is read;
- ``aws-cli-pipe``: ``aws s3 cp --endpoint-url URL s3://bucket/key -`` as a subprocess read to
  EOF, which is how webdataset users read S3 (``pipe:aws s3 cp ...``).

It returns the median seconds, MB/s and samples/s of each method. With ``latency``, every
request goes through a proxy that delays it by that many seconds, as a distant store would.
Run it standalone (``python benchmarks/bench_s3.py``) to benchmark generated shards and print
tables. For ``make bench``, ``bench_s3_table`` and ``bench_stores_table`` give the table rows:
raw iteration over ``s3://`` (SeaweedFS), ``gs://`` (fake-gcs-server) and ``az://`` (Azurite).
"""

from __future__ import annotations

import datetime
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import quote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.fixtures.servers import FaultProxy, SeaweedS3, random_bytes  # noqa: E402
from tests.fixtures.stores import Azurite, FakeGCS  # noqa: E402
from wdsx.sources import SourceOptions, open_source  # noqa: E402
from wdsx.sources.prefetch import Prefetcher  # noqa: E402

READ_SIZE = 1 << 20


def count_samples(path: str) -> int:
    """Samples in a shard by webdataset's rule: members sharing the name up to the first dot."""
    keys = set()
    with tarfile.open(path) as tar:
        for member in tar:
            if member.isfile():
                directory, _, base = member.name.rpartition("/")
                keys.add((directory, base.split(".", 1)[0]))
    return len(keys)


def _drain(read: Callable[[int], bytes]) -> int:
    total = 0
    while data := read(READ_SIZE):
        total += len(data)
    return total


def _read_with_wdsx(urls: list[str], options: SourceOptions) -> int:
    total = 0
    for url in urls:
        with open_source(url, 0, options) as source:
            total += _drain(source.read)
    return total


def _read_with_prefetch(urls: list[str], options: SourceOptions) -> int:
    total = 0
    with Prefetcher(options) as prefetcher:
        for index, url in enumerate(urls):
            source = prefetcher.open(url)
            for upcoming in urls[index + 1 : index + 1 + options.prefetch]:
                prefetcher.schedule(upcoming)
            with source:
                total += _drain(source.read)
    return total


def _read_with_aws_cli(urls: list[str], server: SeaweedS3, endpoint_url: str) -> int:
    aws = shutil.which("aws", path=os.path.dirname(sys.executable)) or "aws"
    env = {**os.environ, **server.env, "AWS_CONFIG_FILE": os.devnull}
    total = 0
    for url in urls:
        command = [aws, "s3", "cp", "--only-show-errors", "--endpoint-url", endpoint_url, url, "-"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, env=env) as process:
            assert process.stdout is not None
            total += _drain(process.stdout.read)
        if process.returncode:
            raise RuntimeError(f"{' '.join(command)} exited with status {process.returncode}")
    return total


def _upload(server: SeaweedS3, shard_paths: list[str]) -> list[str]:
    """Upload local shards to a fresh bucket; their ``s3://`` URLs."""
    bucket = server.new_bucket("bench")
    client = server.client()
    urls = []
    for path in shard_paths:
        key = f"shards/{os.path.basename(path)}"
        client.upload_file(path, bucket, key)
        urls.append(f"s3://{bucket}/{key}")
    return urls


def bench_s3(
    shard_paths: list[str], runs: int = 3, server: SeaweedS3 | None = None, latency: float = 0.0
) -> dict:
    """Median read throughput of the shards from S3 per method (see the module docstring).

    ``server``: an already running :class:`SeaweedS3`; by default one is started and stopped.
    """
    own_server = server is None
    server = server or SeaweedS3().start()
    proxy = FaultProxy(server.port, latency=latency).start() if latency else None
    endpoint_url = proxy.url if proxy else server.endpoint_url
    try:
        urls = _upload(server, shard_paths)
        size = sum(os.path.getsize(path) for path in shard_paths)
        samples = sum(count_samples(path) for path in shard_paths)
        options = server.options_via(endpoint_url)
        methods: dict[str, Callable[[], int]] = {
            "wdsx": lambda: _read_with_wdsx(urls, options),
            "wdsx+prefetch1": lambda: _read_with_prefetch(urls, replace(options, prefetch=1)),
            "wdsx+prefetch4": lambda: _read_with_prefetch(urls, replace(options, prefetch=4)),
            "aws-cli-pipe": lambda: _read_with_aws_cli(urls, server, endpoint_url),
        }
        results: dict = {
            "shards": len(urls),
            "bytes": size,
            "samples": samples,
            "runs": runs,
            "latency": latency,
            "methods": {},
        }
        _read_with_wdsx(urls, options)
        for name, read in methods.items():
            seconds = []
            for _ in range(runs):
                start = time.perf_counter()
                got = read()
                seconds.append(time.perf_counter() - start)
                if got != size:
                    raise RuntimeError(f"{name} read {got} bytes, expected {size}")
            median = statistics.median(seconds)
            results["methods"][name] = {
                "seconds": median,
                "MB/s": size / median / 1e6,
                "samples/s": samples / median,
                "all_seconds": seconds,
            }
        return results
    finally:
        if proxy:
            proxy.stop()
        if own_server:
            server.stop()


def make_shards(directory: str, shards: int, samples: int, sample_size: int) -> list[str]:
    """Tar shards of ``samples`` samples each (a ``.bin`` payload and a ``.cls`` label)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for shard in range(shards):
        path = os.path.join(directory, f"bench-{shard:04d}.tar")
        with tarfile.open(path, "w") as tar:
            for sample in range(samples):
                for ext, payload in (
                    ("bin", random_bytes(sample_size, seed=shard * samples + sample)),
                    ("cls", b"7"),
                ):
                    info = tarfile.TarInfo(f"{shard:04d}{sample:06d}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        paths.append(path)
    return paths


def _print_table(title: str, results: dict) -> None:
    print(
        f"\n{title}: {results['shards']} shards, {results['bytes'] / 1e6:.0f} MB, "
        f"{results['samples']} samples, {results['latency'] * 1000:.0f} ms added per request, "
        f"median of {results['runs']} runs"
    )
    print(f"{'method':<16}{'seconds':>10}{'MB/s':>10}{'samples/s':>12}")
    for name, row in results["methods"].items():
        print(f"{name:<16}{row['seconds']:>10.3f}{row['MB/s']:>10.0f}{row['samples/s']:>12.0f}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="wdsx-bench-s3-") as directory, SeaweedS3() as server:
        large = make_shards(os.path.join(directory, "large"), 8, 250, 100_000)
        small = make_shards(os.path.join(directory, "small"), 32, 10, 50_000)
        for title, shards, latency in (
            ("large shards", large, 0.0),
            ("small shards", small, 0.0),
            ("small shards, distant store", small, 0.02),
        ):
            _print_table(title, bench_s3(shards, server=server, latency=latency))


if __name__ == "__main__":
    main()


def _pipe_aws_urls(urls: list[str], endpoint_url: str) -> list[str]:
    aws = shutil.which("aws", path=os.path.dirname(sys.executable)) or "aws"
    return [f"pipe:{aws} s3 cp --only-show-errors --endpoint-url {endpoint_url} {url} -" for url in urls]


def raw_iteration_row(
    scheme: str, baseline: str, rates: dict[str, float], shard_paths: list[str], target: str = ""
) -> tuple[str, str, str, str, str]:
    """A table row: samples/s and MB/s of wdsx and webdataset iterating the shards raw."""
    size = sum(os.path.getsize(path) for path in shard_paths)
    mb_per_sample = size / sum(count_samples(path) for path in shard_paths) / 1e6
    shards = len(shard_paths)
    return (
        f"{scheme} raw iteration, {shards} x {size / shards / 1e6:.0f} MB shards (webdataset: {baseline})",
        f"{rates['wdsx']:,.0f} /s, {rates['wdsx'] * mb_per_sample:,.0f} MB/s",
        f"{rates['webdataset']:,.0f} /s, {rates['webdataset'] * mb_per_sample:,.0f} MB/s",
        f"{rates['wdsx'] / rates['webdataset']:.2f}x",
        target,
    )


def _compare_raw(urls: list[str], options: SourceOptions, baseline_urls: list[str], repeats: int) -> dict:
    """Samples/s of wdsx over ``urls`` and of webdataset over ``baseline_urls`` (same shards)."""
    import warnings

    import webdataset

    import wdsx
    from benchmarks.measure import compare

    warnings.filterwarnings("ignore")
    return compare(
        {
            "wdsx": lambda: sum(1 for _ in wdsx.WebDataset(urls, options=options, manifest=False)),
            "webdataset": lambda: sum(1 for _ in webdataset.WebDataset(baseline_urls, shardshuffle=False)),
        },
        repeats,
    )


def bench_stores_table(shard_paths: list[str], repeats: int = 3) -> list[tuple[str, str, str, str, str]]:
    """Benchmark-table rows: raw iteration over ``gs://`` (fake-gcs-server) and ``az://`` (Azurite).

    webdataset reads ``gs://`` only through ``gsutil`` (not installed here) and has no ``az://``,
    so its figures are for the same objects read over HTTP with curl, its ``http(s)://`` reader:
    the emulator's media URL, and a URL with a read-only SAS.
    """
    rows = []
    gcs = FakeGCS().start()
    try:
        bucket = gcs.client().bucket(gcs.new_bucket("bench"))
        keys = [f"shards/{os.path.basename(path)}" for path in shard_paths]
        for key, path in zip(keys, shard_paths, strict=True):
            bucket.blob(key).upload_from_filename(path)
        urls = [f"gs://{bucket.name}/{key}" for key in keys]
        media = [
            f"{gcs.endpoint_url}/download/storage/v1/b/{bucket.name}/o/{quote(key, safe='')}?alt=media"
            for key in keys
        ]
        rates = _compare_raw(urls, gcs.options, media, repeats)
        rows.append(raw_iteration_row("gs://", "curl of the media URL", rates, shard_paths))
    finally:
        gcs.stop()
    azure = Azurite().start()
    try:
        container = azure.service().get_container_client(azure.new_container("bench"))
        keys = [f"shards/{os.path.basename(path)}" for path in shard_paths]
        for key, path in zip(keys, shard_paths, strict=True):
            with open(path, "rb") as stream:
                container.upload_blob(key, stream)
        urls = [f"az://{container.container_name}/{key}" for key in keys]
        signed = [_sas_url(azure, container.container_name, key) for key in keys]
        rates = _compare_raw(urls, azure.options, signed, repeats)
        rows.append(raw_iteration_row("az://", "curl of a SAS URL", rates, shard_paths))
    finally:
        azure.stop()
    return rows


def _sas_url(azure: Azurite, container: str, key: str) -> str:
    from azure.storage.blob import BlobSasPermissions, generate_blob_sas

    sas = generate_blob_sas(
        azure.account,
        container,
        key,
        account_key=azure.key,
        permission=BlobSasPermissions(read=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2),
    )
    return f"{azure.endpoint_url}/{azure.account}/{container}/{quote(key)}?{sas}"


def bench_s3_table(shard_paths: list[str], repeats: int = 3) -> list[tuple[str, str, str, str, str]]:
    """Benchmark-table rows: whole pipelines over S3, wdsx (native ``s3://``) against
    webdataset (``pipe:aws s3 cp ... -``), same server, same shards, same run; and the effect
    of prefetching when every request has 20 ms of latency."""
    import wdsx
    from benchmarks.measure import compare

    with SeaweedS3() as server:
        urls = _upload(server, shard_paths)
        saved = {name: os.environ.get(name) for name in [*server.env, "AWS_CONFIG_FILE"]}
        os.environ.update({**server.env, "AWS_CONFIG_FILE": os.devnull})
        try:
            piped = _pipe_aws_urls(urls, server.endpoint_url)
            rates = _compare_raw(urls, server.options, piped, repeats)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        rows = [raw_iteration_row("s3://", "pipe:aws s3 cp", rates, shard_paths, ">= 1.5x")]
        proxy = FaultProxy(server.port, latency=0.02).start()
        try:
            options = {depth: server.options_via(proxy.url, prefetch=depth) for depth in (0, 4)}
            prefetch = compare(
                {
                    depth: (lambda o=o: sum(1 for _ in wdsx.WebDataset(urls, options=o, manifest=False)))
                    for depth, o in options.items()
                },
                repeats,
            )
        finally:
            proxy.stop()
        rows.append(
            (
                "s3:// with 20 ms latency per request: no prefetch / prefetch 4 shards",
                f"{prefetch[0]:,.0f} / {prefetch[4]:,.0f} /s",
                "",
                f"{prefetch[4] / prefetch[0]:.2f}x from prefetch",
                "",
            )
        )
        return rows
