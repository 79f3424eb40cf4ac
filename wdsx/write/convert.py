"""Image folder -> WebDataset shards, reproducible, resumable and parallel (the library behind
``wdsx convert``, see :mod:`wdsx.commands.convert`).

The source is an ImageFolder tree: one sub-folder per class, images anywhere below it. The
whole output is decided before any image is read: the sorted file list (optionally shuffled
with a seed) is cut into shards by webdataset's ``ShardWriter`` rule applied to the files'
sizes. Each shard is then an independent job, so

- any number of worker processes, and any split across the ranks of a job (shard ``i``
  belongs to rank ``i % world_size``; the rank comes from torch.distributed or the launcher,
  see :func:`wdsx.core.topology.rank_and_world`), writes byte-identical shards;
- a re-run skips shards already complete: shards are written atomically, and each is followed
  by a small hidden record (``.<shard>.json``: the plan's fingerprint, its manifest entry, the
  images it skipped), so "record present and shard size matches" means done;
- whoever completes the last shard merges the records into the dataset manifest
  (``<stem>.manifest.json``, with ``classes``) and removes them.

Samples are ``{"__key__": "<class>/<stem>", "<ext>": original bytes, "cls": class index}``.
"""

from __future__ import annotations

import hashlib
import io
import json
import multiprocessing
import os
import posixpath
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image, ImageOps, UnidentifiedImageError

from wdsx.core import rng, topology
from wdsx.core.jsontext import parse_json
from wdsx.read.manifest import Manifest, ShardEntry, manifest_url_for_pattern, natural_key, read_if_present
from wdsx.sources import SourceOptions, local_path
from wdsx.write.folder import IMAGE_EXTENSIONS, ConvertError, ImageFile, leaves_folder, list_images
from wdsx.write.partial import write_whole
from wdsx.write.writer import TarWriter, checked_pattern, shard_is_full

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

__all__ = ["IMAGE_EXTENSIONS", "ConvertError", "ConvertReport", "ConvertSettings", "ImageFile", "convert"]

REENCODE_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
VERIFY_MODES = ("header", "decode")
PLAN_VERSION = 1
"""Bump when the bytes written for the same inputs change, so old shards are not reused."""

_FORMAT_FIELD = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}


@dataclass(frozen=True)
class ConvertSettings:
    """Everything that decides the bytes of the output; part of the plan's fingerprint."""

    maxcount: int = 10000
    """Samples per shard at most."""
    maxsize: float = 1e9
    """Payload bytes per shard before a new one starts (counted on the source files' sizes)."""
    shuffle: bool = False
    seed: int = 0
    reencode: str | None = None
    """``jpg``, ``png`` or ``webp``: re-encode every image. None keeps the original bytes."""
    quality: int = 95
    """JPEG/WebP quality when re-encoding."""
    resize: int | None = None
    """Shrink images whose shorter side exceeds this to exactly this (aspect kept)."""
    verify: str = "header"
    """How kept-as-is images are checked: ``header`` (parse; JPEG must end with its end
    marker) or ``decode`` (decode the pixels, at 1/8 scale for JPEG)."""

    def __post_init__(self) -> None:
        if self.reencode is not None and self.reencode not in REENCODE_FORMATS:
            raise ValueError(f"--reencode must be one of {sorted(REENCODE_FORMATS)}, not {self.reencode!r}")
        if self.verify not in VERIFY_MODES:
            raise ValueError(f"--verify must be one of {VERIFY_MODES}, not {self.verify!r}")
        if self.maxcount < 1 or self.maxsize <= 0:
            raise ValueError("--maxcount and --maxsize must be positive")
        if self.resize is not None and self.resize < 1:
            raise ValueError("--resize must be positive")


@dataclass(frozen=True)
class ShardJob:
    """One shard to write: everything a worker process needs."""

    url: str
    record_url: str
    src: str
    images: list[ImageFile]
    settings: ConvertSettings
    fingerprint: str
    strict: bool
    options: SourceOptions | None
    follow_symlinks: bool = False


@dataclass
class ConvertReport:
    """What a run did."""

    shards: int
    """Shards in the whole plan (all ranks)."""
    written: int = 0
    """Shards this run wrote."""
    reused: int = 0
    """Shards of this rank found complete and left alone."""
    samples: int = 0
    """Samples in this rank's shards (written or reused)."""
    samples_written: int = 0
    """Samples this run wrote."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(path, reason)`` of the images left out of this rank's shards (written or reused), and
    of what listing the folder left out (links out of it)."""
    warnings: list[tuple[str, str]] = field(default_factory=list)
    """``(path, message)`` of the warnings decoders gave about the images this run wrote (say,
    Pillow's "truncated EXIF data"), instead of letting them spill onto stderr."""
    src: str = ""
    """The source folder; the paths above are relative to it."""
    manifest_url: str | None = None
    """The manifest, when this run found every shard complete and wrote (or found) it."""
    seconds: float = 0.0


# --- the plan ---------------------------------------------------------------------------------


def shard_pattern(dest: str) -> str:
    """DEST as a shard pattern: kept if it has a ``%`` directive; ``out/train`` -> ``out/train-%06d.tar``."""
    if "%" in dest:
        return dest
    return dest + ("%06d.tar" if dest.endswith("/") else "-%06d.tar")


def plan_shards(images: Sequence[ImageFile], settings: ConvertSettings) -> list[list[ImageFile]]:
    """Cut the images, in output order, into shards as ``ShardWriter`` would cut them.

    A sample's size is its source file's bytes plus the label's; when re-encoding, the output
    size is unknown until encoded, and the plan must not depend on it (it must be the same in
    every process), so ``maxsize`` then applies to the source sizes.
    """
    order: Sequence[ImageFile] = images
    if settings.shuffle:
        permutation = rng.permutation(len(images), rng.derive_seed("wdsx convert", settings.seed))
        order = [images[i] for i in permutation]
    shards: list[list[ImageFile]] = []
    size = 0
    for image in order:
        if not shards or shard_is_full(len(shards[-1]), size, settings.maxcount, settings.maxsize):
            shards.append([])
            size = 0
        shards[-1].append(image)
        size += image.size + len(str(image.label))
    return shards


def fingerprint(
    classes: Sequence[str], shards: Sequence[Sequence[ImageFile]], settings: ConvertSettings
) -> str:
    """A hash of everything the output bytes depend on: settings, classes, files and their sizes."""
    digest = hashlib.sha256(json.dumps([PLAN_VERSION, asdict(settings), list(classes)]).encode())
    for number, shard in enumerate(shards):
        for image in shard:
            digest.update(f"{number}\t{image.path}\t{image.size}\t{image.label}\n".encode())
    return digest.hexdigest()


# --- one shard ----------------------------------------------------------------------------------


def _opened(data: bytes) -> Image.Image:
    """``data`` opened by Pillow; a format it does not know is a ValueError saying so (Pillow's
    own message names the in-memory buffer, ``<_io.BytesIO object at 0x...>``, not the file)."""
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ValueError("not an image format Pillow recognises") from None


def check_image(data: bytes, verify: str = "header") -> None:
    """Raise if ``data`` is not a readable image.

    ``header`` parses the headers (PNG chunks are CRC-checked) and requires a JPEG to end
    with its end-of-image marker, which catches truncated files at little cost; ``decode``
    also decodes the pixels (JPEG at 1/8 scale, which still reads every coded block).
    """
    with _opened(data) as image:
        image_format = image.format or ""
        if verify == "decode":
            if image_format == "JPEG":
                image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
            image.load()
        else:
            image.verify()
    if image_format == "JPEG" and not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        raise ValueError("truncated JPEG (no end-of-image marker)")


def _scaled(width: int, height: int, shorter: int) -> tuple[int, int]:
    scale = shorter / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _encode(image: Image.Image, field_name: str, quality: int) -> bytes:
    pil_format = REENCODE_FORMATS[field_name]
    options: dict[str, object] = {}
    if pil_format == "JPEG":
        options["quality"] = quality
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
    elif pil_format == "WEBP":
        options["quality"] = quality
        if image.mode not in ("RGB", "RGBA"):
            has_alpha = "A" in image.mode or "transparency" in image.info
            image = image.convert("RGBA" if has_alpha else "RGB")
    elif image.mode == "CMYK":
        image = image.convert("RGB")
    out = io.BytesIO()
    image.save(out, format=pil_format, **options)
    return out.getvalue()


def prepare_image(data: bytes, image_file: ImageFile, settings: ConvertSettings) -> tuple[str, bytes]:
    """The field name and bytes to store for one image; raises if the image is unreadable.

    Kept as is unless re-encoding is asked for: ``reencode`` re-encodes every image,
    ``resize`` alone only those larger than the size (in their own format; others as PNG).
    Re-encoding applies the EXIF orientation, since the EXIF tag is not carried over.
    """
    if settings.reencode is None and settings.resize is None:
        check_image(data, settings.verify)
        return image_file.field, data
    with _opened(data) as image:
        too_large = settings.resize is not None and min(image.size) > settings.resize
        shorter = settings.resize if too_large else None
        if settings.reencode is None and shorter is None:
            check_image(data, settings.verify)
            return image_file.field, data
        field_name = settings.reencode or _FORMAT_FIELD.get(image.format or "", "png")
        if shorter is not None and image.format == "JPEG":
            image.draft(image.mode, _scaled(*image.size, shorter))
        image.load()
        upright = ImageOps.exif_transpose(image)
        if shorter is not None:
            upright = upright.resize(_scaled(*upright.size, shorter), Image.Resampling.LANCZOS)
        return field_name, _encode(upright, field_name, settings.quality)


def _write_json(url: str, value: object, options: SourceOptions | None) -> None:
    write_whole(url, json.dumps(value).encode("utf-8"), options)


def _read_json(url: str, options: SourceOptions | None) -> dict | None:
    data = read_if_present(url, options)
    return None if data is None else parse_json(data)


def _read_image(job: ShardJob, image_file: ImageFile) -> bytes:
    """The bytes of one source image; a link that has come to lead out of the folder since it
    was listed is refused (unless links are followed)."""
    target = None if job.follow_symlinks else leaves_folder(job.src, image_file.path)
    if target is not None:
        raise ValueError(f"symbolic link to {target}, outside the source folder")
    with open(os.path.join(job.src, image_file.path), "rb") as file:
        return file.read()


def write_shard(job: ShardJob, progress: Callable[[int], object] = lambda n: None) -> dict:
    """Write one planned shard, then its completion record; returns the record.

    Warnings that decoders give about an image are recorded with its path, not printed."""
    skipped, noted = [], []
    with TarWriter(job.url, encoder=False, options=job.options) as writer:
        for image_file in job.images:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    field_name, payload = prepare_image(
                        _read_image(job, image_file), image_file, job.settings
                    )
                    label = b"%d" % image_file.label
                    writer.write({"__key__": image_file.key, field_name: payload, "cls": label})
                except Exception as exn:
                    if writer.closed:  # the shard itself failed (a full disk): not this image
                        raise
                    reason = f"{type(exn).__name__}: {exn}"
                    if job.strict:
                        raise ConvertError(f"{image_file.path}: {reason} (--strict)") from exn
                    skipped.append((image_file.path, reason))
            noted += [(image_file.path, f"{w.category.__name__}: {w.message}") for w in caught]
            progress(1)
    entry = ShardEntry(posixpath.basename(job.url), writer.count, writer.bytes_written, writer.sha256)
    record = {"fingerprint": job.fingerprint, "shard": asdict(entry), "skipped": skipped, "warnings": noted}
    _write_json(job.record_url, record, job.options)
    return record


# --- the run ------------------------------------------------------------------------------------


def _record_url(shard_url: str) -> str:
    directory, _, base = shard_url.rpartition("/")
    return f"{directory}/.{base}.json" if directory else f".{base}.json"


def _is_complete(url: str, entry: dict) -> bool:
    """A recorded shard still there, at its recorded size (remote shards: the record suffices)."""
    path = local_path(url)
    if path is None:
        return True
    try:
        return os.stat(path).st_size == entry["bytes"]
    except FileNotFoundError:
        return False


def _manifest_records(manifest_url: str, plan_id: str, options: SourceOptions | None) -> dict[str, dict]:
    """Shard name -> completion record, from the manifest of a finished run of the same plan."""
    manifest = Manifest.load(manifest_url, options)
    if manifest is None or manifest.extra.get("convert", {}).get("fingerprint") != plan_id:
        return {}
    skipped_by_shard = manifest.extra["convert"].get("skipped_by_shard", {})
    return {
        entry.name: {"shard": asdict(entry), "skipped": skipped_by_shard.get(entry.name, [])}
        for entry in manifest.shards
    }


class _Records:
    """Completion records of the plan's shards: in the manifest once a run has finished, else in
    the per-shard record files."""

    def __init__(self, urls: Sequence[str], manifest_url: str, plan_id: str, options: SourceOptions | None):
        self.urls = urls
        self.manifest_url = manifest_url
        self.plan_id = plan_id
        self.options = options
        self.from_manifest = _manifest_records(manifest_url, plan_id, options)

    def get(self, number: int) -> dict | None:
        """The record of shard ``number`` if the shard is complete, else None."""
        url = self.urls[number]
        record = self.from_manifest.get(posixpath.basename(url))
        if record is None:
            record = _read_json(_record_url(url), self.options)
            if record is None or record.get("fingerprint") != self.plan_id:
                return None
        return record if _is_complete(url, record["shard"]) else None

    def finish(self, classes: Sequence[str]) -> bool:
        """Write the manifest if every shard is complete; True if the manifest is in place.

        Rank processes write their records before calling this, so the last one to finish
        sees them all. Two finishing at once write the same bytes; one may find the records
        already merged and removed by the other, and then finds the manifest instead.
        """
        found = [self.get(number) for number in range(len(self.urls))]
        records = [record for record in found if record is not None]
        if len(records) < len(found):
            return bool(_manifest_records(self.manifest_url, self.plan_id, self.options))
        shards = [ShardEntry(**record["shard"]) for record in records]
        skipped = {
            shard.name: record["skipped"]
            for shard, record in zip(shards, records, strict=True)
            if record["skipped"]
        }
        extra = {
            "classes": list(classes),
            "convert": {"fingerprint": self.plan_id, "skipped_by_shard": skipped},
        }
        write_whole(self.manifest_url, Manifest(shards, extra).to_json().encode("utf-8"), self.options)
        for url in self.urls:
            path = local_path(_record_url(url))
            if path is not None and os.path.exists(path):
                os.unlink(path)
        return True


def _progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar on stderr (rate and ETA), or None when disabled or tqdm is not installed."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="img", file=sys.stderr, dynamic_ncols=True, smoothing=0.05)


_worker_counter: Synchronized[int] | None = None
"""In a pool worker: the images done by all workers, shared with the parent's progress bar."""


def _init_worker(counter: Synchronized[int]) -> None:
    """Pool initializer: keep the shared counter (it can only reach workers as they start)."""
    global _worker_counter
    _worker_counter = counter


def _count_in_worker(n: int) -> None:
    """Progress callback of shards written in a pool worker: add ``n`` images to the count."""
    counter = _worker_counter
    assert counter is not None, "only pool workers, set up by _init_worker, count"
    with counter.get_lock():
        counter.value += n


def _job_in_worker(job: ShardJob) -> dict:
    return write_shard(job, _count_in_worker)


def _run_jobs(jobs: list[ShardJob], workers: int, bar: Any) -> list[dict]:
    """Write the shards, in this process or in ``workers`` processes; returns their records."""
    update = bar.update if bar is not None else (lambda n: None)
    if workers <= 1 or len(jobs) <= 1:
        return [write_shard(job, update) for job in jobs]
    context = multiprocessing.get_context()
    counter = context.Value("q", 0)
    records: list[dict] = []
    with context.Pool(min(workers, len(jobs)), _init_worker, (counter,)) as pool:
        results = pool.imap_unordered(_job_in_worker, jobs)
        shown = 0
        while len(records) < len(jobs):
            try:
                records.append(results.next(timeout=0.2))
            except multiprocessing.TimeoutError:
                pass
            done = counter.value
            update(done - shown)
            shown = done
    return records


def _no_samples(report: ConvertReport) -> ConvertError:
    """The error of a run whose shards hold no sample at all, with the report attached."""
    examples = "; ".join(f"{path}: {reason}" for path, reason in report.skipped[:3])
    error = ConvertError(
        f"{report.src}: no image could be read, nothing usable was written "
        f"({len(report.skipped)} skipped{', e.g. ' + examples if examples else ''})"
    )
    error.report = report
    return error


def convert(
    src: str,
    dest: str,
    settings: ConvertSettings | None = None,
    *,
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    strict: bool = False,
    progress: bool = False,
    options: SourceOptions | None = None,
    follow_symlinks: bool = False,
) -> ConvertReport:
    """Convert the image folder ``src`` into shards at ``dest`` (a pattern or a prefix).

    ``rank``/``world_size`` default to this process's place in the job: torch.distributed's
    when it is initialised, else the launcher's (torchrun, SLURM, Open MPI or MPICH variables;
    see :func:`wdsx.core.topology.rank_and_world`), else 0 of 1.
    ``strict`` raises :class:`ConvertError` at the first unreadable image instead of skipping it.
    Symbolic links out of ``src`` are left out (and reported) unless ``follow_symlinks``.
    A rank whose shards end up holding no sample at all raises :class:`ConvertError` (with the
    report as its ``report`` attribute) instead of writing the manifest of an empty dataset.
    """
    started = time.perf_counter()
    settings = settings or ConvertSettings()
    if rank is None or world_size is None:
        rank, world_size = topology.rank_and_world()
    if not 0 <= rank < world_size:
        raise ConvertError(f"rank {rank} is not in 0..{world_size - 1}")
    src = os.path.abspath(src)
    pattern = checked_pattern(shard_pattern(dest))
    listing = list_images(src, follow_symlinks)
    if not listing.images:
        raise ConvertError(f"{src}: no images found (expected one sub-folder of images per class)")
    shards = plan_shards(listing.images, settings)
    plan_id = fingerprint(listing.classes, shards, settings)
    urls = [pattern % number for number in range(len(shards))]
    records = _Records(urls, manifest_url_for_pattern(pattern), plan_id, options)
    report = ConvertReport(shards=len(shards), src=src, skipped=list(listing.skipped) if rank == 0 else [])
    complete, jobs = [], []
    for number in range(rank, len(shards), world_size):
        record = records.get(number)
        if record is not None:
            complete.append(record)
            continue
        record_url = _record_url(urls[number])
        job = ShardJob(
            urls[number], record_url, src, shards[number], settings, plan_id, strict, options, follow_symlinks
        )
        jobs.append(job)
    bar = _progress_bar(sum(len(job.images) for job in jobs), progress)
    try:
        written = _run_jobs(jobs, workers, bar)
    finally:
        if bar is not None:
            bar.close()
    report.written, report.reused = len(written), len(complete)
    report.samples_written = sum(record["shard"]["samples"] for record in written)
    for record in sorted(complete + written, key=lambda record: natural_key(record["shard"]["name"])):
        report.samples += record["shard"]["samples"]
        report.skipped += [(path, reason) for path, reason in record["skipped"]]
        report.warnings += [(path, message) for path, message in record.get("warnings", [])]
    if report.samples == 0 and (complete or written):
        raise _no_samples(report)
    if records.finish(listing.classes):
        report.manifest_url = records.manifest_url
    report.seconds = time.perf_counter() - started
    return report
