"""The source of ``wdsx convert``: an image folder listed into images with their sample keys,
without leaving the folder. Either an ImageFolder tree (one sub-folder per class, the class
index becomes the sample's label) or a folder of unlabeled images (every image below it).

A symbolic link that leads out of the source folder (``cat/x.jpg -> /etc/passwd``,
``cat/more -> /``) is not followed unless asked for (``follow_symlinks``): converting a folder
someone else prepared must not read, and publish into shards, files elsewhere on the machine.
Links inside the folder are followed, and a link that loops back to a folder already listed is
listed once.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from wdsx.core.errors import WriteError

LABEL_MODES = ("auto", "folders", "none")
"""How images get labels: ``folders`` (one sub-folder per class), ``none`` (unlabeled), ``auto``
(unlabeled when the folder holds images itself, else one sub-folder per class)."""
IMAGE_EXTENSIONS = frozenset("jpg jpeg jpe png webp bmp gif tif tiff ppm pgm pbm".split())
"""File extensions (any case) taken as images."""
_FIELD_FOR_EXT = {"jpeg": "jpg", "jpe": "jpg"}


class ConvertError(WriteError):
    """The conversion cannot go on (bad source folder, a bad image with ``strict``, or no image
    readable at all); ``report`` is the run's :class:`~wdsx.write.convert.ConvertReport` when it
    got that far."""


@dataclass(frozen=True, slots=True)
class ImageFile:
    """One source image and the sample it becomes."""

    path: str
    """Relative to the source folder, with ``/`` separators."""
    key: str
    label: int
    """The class index (0 for unlabeled images)."""
    field: str
    """Extension under which the original bytes are stored (lower case, ``jpeg`` -> ``jpg``)."""
    size: int


@dataclass
class Listing:
    """What :func:`list_images` found."""

    classes: list[str] | None
    """The class names, in label order; None for unlabeled images."""
    images: list[ImageFile]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """``(path, reason)`` of what was left out while listing: links out of the folder, broken
    links."""


def inside(path: str, root: str) -> bool:
    """Whether the real ``path`` lies in the real directory ``root`` (both already resolved)."""
    return os.path.commonpath((path, root)) == root


def leaves_folder(root: str, relative: str) -> str | None:
    """The real target of ``root/relative`` when it lies outside ``root`` (a link out), else None."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, relative))
    return None if inside(target, real_root) else target


class _Walker:
    """Lists the non-hidden image files below a folder, by the symbolic-link policy."""

    def __init__(self, root: str, follow_symlinks: bool):
        self.root = root
        self.real_root = os.path.realpath(root)
        self.follow = follow_symlinks
        self.seen: set[str] = set()
        self.skipped: list[tuple[str, str]] = []

    def admits(self, entry: os.DirEntry, path: str) -> bool:
        """Whether ``entry`` (at ``path``, relative) is listed: not a link out of the folder
        (unless links are followed), not a broken link, not a folder listed already."""
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if not os.path.exists(target):
                self.skipped.append((path, f"broken symbolic link to {target}"))
                return False
            if not self.follow and not inside(target, self.real_root):
                self.skipped.append(
                    (
                        path,
                        f"symbolic link to {target}, outside the source folder (--follow-symlinks reads it)",
                    )
                )
                return False
        if entry.is_dir():
            real = os.path.realpath(entry.path)
            if real in self.seen:
                return False
            self.seen.add(real)
        return True

    def walk(self, relative: str) -> list[tuple[str, int]]:
        """``(relative path, size)`` of every listed image file below ``root/relative``."""
        found = []
        with os.scandir(os.path.join(self.root, relative)) as entries:
            for entry in entries:
                path = f"{relative}/{entry.name}" if relative else entry.name
                if entry.name.startswith(".") or not self.admits(entry, path):
                    continue
                if entry.is_dir():
                    found += self.walk(path)
                elif entry.name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS:
                    found.append((path, entry.stat().st_size))
        return found


def _escape(stem: str) -> str:
    """A key part without dots (readers cut keys at the first dot), reversibly: ``%`` -> ``%25``."""
    return stem.replace("%", "%25").replace(".", "%2E")


def list_images(src: str, follow_symlinks: bool = False, labels: str = "auto") -> Listing:
    """The class names (sorted sub-folders, or None when unlabeled, see :data:`LABEL_MODES`) and
    the images, sorted by path, with their keys.

    Hidden files and folders (``.``-prefixed, e.g. macOS ``._x.jpg`` or
    ``.ipynb_checkpoints``) are ignored. The key is the path without extension, its last
    component escaped (``.`` -> ``%2E``); when one folder holds several images with the same
    stem (``a.jpg``, ``a.png``) their keys keep the escaped extension so they stay distinct.
    Symbolic links out of ``src`` are left out (and reported) unless ``follow_symlinks``.
    """
    if labels not in LABEL_MODES:
        raise ValueError(f"labels must be one of {LABEL_MODES}, not {labels!r}")
    if not os.path.isdir(src):
        raise ConvertError(f"{src}: not a directory")
    walker = _Walker(src, follow_symlinks)
    if labels == "auto":
        labels = "none" if _holds_images(src) else "folders"
    classes: list[str] | None = None
    if labels == "none":
        found = sorted((path, size, 0) for path, size in walker.walk(""))
    else:
        with os.scandir(src) as entries:
            folders = [
                e for e in entries if not e.name.startswith(".") and e.is_dir() and walker.admits(e, e.name)
            ]
        classes = sorted(e.name for e in folders)
        found = sorted(
            (path, size, label) for label, name in enumerate(classes) for path, size in walker.walk(name)
        )
    stems = Counter(path.rpartition(".")[0] for path, _, _ in found)
    images = []
    for path, size, label in found:
        stem, _, ext = path.rpartition(".")
        directory, slash, base = stem.rpartition("/")
        base = base if stems[stem] == 1 else f"{base}.{ext}"
        field_name = _FIELD_FOR_EXT.get(ext.lower(), ext.lower())
        images.append(ImageFile(path, f"{directory}{slash}{_escape(base)}", label, field_name, size))
    keys = Counter(image.key for image in images)
    clashes = [image.path for image in images if keys[image.key] > 1]
    if clashes:
        raise ConvertError(f"these images would get the same sample key: {clashes[:4]}; rename them")
    return Listing(classes, images, sorted(walker.skipped))


def _holds_images(src: str) -> bool:
    """Whether the folder itself (not a sub-folder) holds an image file."""
    with os.scandir(src) as entries:
        return any(
            not e.name.startswith(".") and e.name.rpartition(".")[2].lower() in IMAGE_EXTENSIONS
            for e in entries
        )
