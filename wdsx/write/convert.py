"""Image folder -> WebDataset shards, reproducible, resumable and parallel (the library behind
``wdsx convert``, see :mod:`wdsx.commands.convert`): the image-folder use of the general
writer, :func:`wdsx.write.dataset.write_dataset`.

The source is an image folder, either an ImageFolder tree (one sub-folder per class, images
anywhere below it) or a folder of unlabeled images (see :func:`~wdsx.write.folder.list_images`).
The sorted file list (optionally shuffled with a seed) is cut into shards by webdataset's
``ShardWriter`` rule applied to the files' sizes before any image is read, so any number of
worker processes, launcher ranks or Ray tasks write byte-identical shards; a re-run skips the
shards already complete; whoever completes the last shard writes the manifest
(``<stem>.manifest.json``, with ``classes``).

Samples are ``{"__key__": "<class>/<stem>", "<ext>": original bytes, "cls": class index}``
(unlabeled: ``{"__key__": "<path without extension>", "<ext>": bytes}``).
"""

from __future__ import annotations

import io
import os
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

from PIL import Image, ImageOps

from wdsx.codecs.decode import open_image
from wdsx.sources import SourceOptions
from wdsx.write.dataset import WriteReport, execute
from wdsx.write.folder import (
    IMAGE_EXTENSIONS,
    ConvertError,
    ImageFile,
    leaves_folder,
    list_images,
)
from wdsx.write.jobs import JobRunner, WriteError
from wdsx.write.plan import plan_writes, shard_pattern
from wdsx.write.writer import checked_pattern

__all__ = ["IMAGE_EXTENSIONS", "ConvertError", "ConvertReport", "ConvertSettings", "ImageFile", "convert"]

REENCODE_FORMATS = {"jpg": "JPEG", "png": "PNG", "webp": "WEBP"}
VERIFY_MODES = ("header", "decode")
IMAGES_VERSION = 2
"""Bump when the bytes written for the same images and settings change."""

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


@dataclass
class ConvertReport(WriteReport):
    """What a run did; inputs are named by their path relative to :attr:`src`."""

    src: str = ""
    """The source folder; the paths in ``skipped`` and ``warnings`` are relative to it. What
    listing the folder left out (links out of it) is in ``skipped`` too."""
    classes: list[str] = field(default_factory=list)


# --- one image ----------------------------------------------------------------------------------


def check_image(data: bytes, verify: str = "header") -> None:
    """Raise if ``data`` is not a readable image.

    ``header`` parses the headers (PNG chunks are CRC-checked) and requires a JPEG to end
    with its end-of-image marker, which catches truncated files at little cost; ``decode``
    also decodes the pixels (JPEG at 1/8 scale, which still reads every coded block).
    """
    with open_image(data) as image:
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
    with open_image(data) as image:
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


@dataclass(frozen=True)
class ImageSamples:
    """The sample function of a conversion: one image file -> its sample (picklable, so that
    worker processes and Ray tasks run it)."""

    src: str
    settings: ConvertSettings
    labeled: bool = True
    follow_symlinks: bool = False

    def read(self, image_file: ImageFile) -> bytes:
        """The bytes of one source image; a link that has come to lead out of the folder since
        it was listed is refused (unless links are followed)."""
        target = None if self.follow_symlinks else leaves_folder(self.src, image_file.path)
        if target is not None:
            raise ValueError(f"symbolic link to {target}, outside the source folder")
        with open(os.path.join(self.src, image_file.path), "rb") as file:
            return file.read()

    def __call__(self, image_file: ImageFile) -> dict[str, Any]:
        field_name, payload = prepare_image(self.read(image_file), image_file, self.settings)
        sample: dict[str, Any] = {"__key__": image_file.key, field_name: payload}
        if self.labeled:
            sample["cls"] = b"%d" % image_file.label
        return sample


def convert(
    src: str,
    dest: str,
    settings: ConvertSettings | None = None,
    *,
    workers: int = 1,
    rank: int | None = None,
    world_size: int | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    strict: bool = False,
    progress: bool = False,
    options: SourceOptions | None = None,
    follow_symlinks: bool = False,
    labels: str = "auto",
) -> ConvertReport:
    """Convert the image folder ``src`` into shards at ``dest`` (a pattern or a prefix).

    ``labels``: ``"folders"`` (one sub-folder per class), ``"none"`` (unlabeled, every image
    below ``src``) or ``"auto"`` (unlabeled when ``src`` holds images itself, else folders).
    ``engine``, ``workers``, ``rank``/``world_size`` and ``ray_address`` choose who writes the
    shards, as for :func:`~wdsx.write.dataset.execute`. ``strict`` raises
    :class:`ConvertError` at the first unreadable image instead of skipping it. Symbolic links
    out of ``src`` are left out (and reported) unless ``follow_symlinks``. A rank whose shards
    end up holding no sample at all raises :class:`ConvertError` (with the report as its
    ``report`` attribute) instead of writing the manifest of an empty dataset.
    """
    settings = settings or ConvertSettings()
    src = os.path.abspath(src)
    checked_pattern(shard_pattern(dest))  # a bad destination fails before the folder is listed
    listing = list_images(src, follow_symlinks, labels)
    if not listing.images:
        raise ConvertError(f"{src}: no images found")
    labeled = listing.classes is not None
    classes = listing.classes or []
    plan = plan_writes(
        listing.images,
        dest,
        maxcount=settings.maxcount,
        maxsize=settings.maxsize,
        sizes=[image.size + len(str(image.label)) for image in listing.images],
        shuffle=settings.shuffle,
        seed=settings.seed,
        identity=[IMAGES_VERSION, asdict(settings), classes, labeled],
        extra={"classes": classes} if labeled else {},
    )
    runner = JobRunner(
        ImageSamples(src, settings, labeled, follow_symlinks),
        strict,
        attrgetter("path"),
        options,
        encoder=False,
    )
    try:
        done = execute(
            plan,
            runner,
            engine=engine,
            workers=workers,
            rank=rank,
            world_size=world_size,
            ray_address=ray_address,
            progress=progress,
            unit="img",
        )
    except WriteError as exn:
        if exn.report is None:
            raise ConvertError(str(exn)) from exn
        raise _no_images(_convert_report(exn.report, src, classes, listing.skipped)) from None
    return _convert_report(done, src, classes, listing.skipped)


def _convert_report(
    done: WriteReport, src: str, classes: list[str], listed: list[tuple[str, str]]
) -> ConvertReport:
    """The report of the writer's run, plus what listing the folder left out (rank 0 only)."""
    fields = {name: getattr(done, name) for name in done.__dataclass_fields__}
    fields["skipped"] = (list(listed) if done.rank == 0 else []) + done.skipped
    return ConvertReport(**fields, src=src, classes=classes)


def _no_images(report: ConvertReport) -> ConvertError:
    """The error of a run whose shards hold no sample at all, with the report attached."""
    examples = "; ".join(f"{path}: {reason}" for path, reason in report.skipped[:3])
    error = ConvertError(
        f"{report.src}: no image could be read, nothing usable was written "
        f"({len(report.skipped)} skipped{', e.g. ' + examples if examples else ''})"
    )
    error.report = report
    return error
