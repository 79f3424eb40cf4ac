"""How much memory reading may spend on what a shard's bytes claim: one policy, in one place.

Every size a reader or decoder allocates from comes from data, so each is bounded by the
bytes that really arrive, or by one of these limits. Each is an environment variable, read
when a stream or a field is opened (not once at import), so that a running program and its
DataLoader workers see a change:

``WDSX_MAX_MEMBER_BYTES`` (16 GiB)
    The largest tar member a reader accepts. Members are never allocated on a header's word:
    a member grows only as its bytes arrive, so a stored member costs what the shard really
    holds. Multi-GB video members are ordinary; this only bounds a stream of unknown length.
``WDSX_MAX_INFLATE_RATIO`` (100) and ``WDSX_INFLATE_GRACE_BYTES`` (64 MiB)
    Decompressing (a ``.tar.gz``/``.tar.bz2``/``.tar.xz`` shard, a ``.gz`` field, the members
    of an ``.npz`` field) may produce more than ``WDSX_INFLATE_GRACE_BYTES`` only where every
    ``WDSX_INFLATE_GRACE_BYTES`` of output came from at least 1/``WDSX_MAX_INFLATE_RATIO`` of
    that in compressed bytes. Ordinary data (text, JSON, tar headers, arrays of real values)
    compresses well under 100x; a stream of zeros compresses about 1000x with gzip and far
    more with bzip2. So a shard of ``n`` compressed bytes never holds more than about
    ``64 MiB + 100 * n`` in memory, whatever its headers say.
``WDSX_MAX_LINE_BYTES`` (64 MiB)
    The longest line of a JSONL shard. A longer line is an error naming its shard, line and
    byte offset (a continuing handler skips it), and is never held in memory whole.
``WDSX_MAX_IMAGE_PIXELS`` (Pillow's limit)
    The most pixels (height x width) an image field may decode to, on every path: Pillow's,
    and the direct JPEG paths that bypass Pillow (``rgb8``, ``rgb``, ``torchrgb``... through
    simplejpeg, checked from the JPEG header before any pixel is decoded). Unset, it is the
    point where Pillow itself refuses an image: twice ``PIL.Image.MAX_IMAGE_PIXELS`` (about
    179 million pixels by default), no limit when a program set that to None. Pillow's own
    check also applies on its path, so the stricter of the two wins everywhere. An image
    decoder reads it when it is made (a look-up per image would cost more than the check).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from wdsx.core.env import number_from_environment

MAX_MEMBER = "WDSX_MAX_MEMBER_BYTES"
MAX_INFLATE_RATIO = "WDSX_MAX_INFLATE_RATIO"
INFLATE_GRACE = "WDSX_INFLATE_GRACE_BYTES"
MAX_LINE = "WDSX_MAX_LINE_BYTES"
MAX_IMAGE_PIXELS = "WDSX_MAX_IMAGE_PIXELS"

_DEFAULTS = {
    MAX_MEMBER: 1 << 34,
    MAX_INFLATE_RATIO: 100,
    INFLATE_GRACE: 1 << 26,
    MAX_LINE: 1 << 26,
}


def _positive(name: str) -> int:
    """The positive integer the variable ``name`` holds, else its default."""
    return _set(name) or _DEFAULTS[name]


def _set(name: str) -> int | None:
    """The positive integer the variable ``name`` holds; None when it is unset or empty."""
    number = number_from_environment(name, int, "a whole number")
    if number is not None and number <= 0:
        raise ValueError(f"{name} must be positive, not {os.environ.get(name)!r}")
    return number


def max_member_bytes() -> int:
    """The largest tar member a reader accepts (``WDSX_MAX_MEMBER_BYTES``, default 16 GiB)."""
    return _positive(MAX_MEMBER)


def max_line_bytes() -> int:
    """The longest JSONL line a reader accepts (``WDSX_MAX_LINE_BYTES``, default 64 MiB)."""
    return _positive(MAX_LINE)


@dataclass(frozen=True)
class Inflation:
    """How far decompressed data may outgrow its compressed bytes: beyond ``grace`` bytes of
    output, at most ``ratio`` times the compressed bytes it came from."""

    ratio: int
    grace: int

    @classmethod
    def from_environment(cls) -> Inflation:
        """The limits set by ``WDSX_MAX_INFLATE_RATIO`` and ``WDSX_INFLATE_GRACE_BYTES``."""
        return cls(_positive(MAX_INFLATE_RATIO), _positive(INFLATE_GRACE))

    def allowed(self, compressed: int) -> int:
        """The most bytes that ``compressed`` bytes may decompress to as a whole."""
        return max(self.grace, self.ratio * compressed)

    def refusal(self, produced: int, compressed: int) -> str:
        """Why ``compressed`` bytes that decompress to ``produced`` bytes are refused."""
        return (
            f"{compressed} compressed bytes inflate to {produced} bytes, more than {self.ratio} "
            f"times as many (a decompression bomb?); raise {MAX_INFLATE_RATIO} (now {self.ratio}) "
            f"or {INFLATE_GRACE} (now {self.grace}) if this data is trusted"
        )


def max_image_pixels() -> int | None:
    """The most pixels an image field may decode to: ``WDSX_MAX_IMAGE_PIXELS`` if set, and
    Pillow's own refusal point (twice ``PIL.Image.MAX_IMAGE_PIXELS``) unless a program set
    that to None; the smaller when both apply; None for no limit."""
    import PIL.Image

    pillow = PIL.Image.MAX_IMAGE_PIXELS
    pillow_limit = None if pillow is None else 2 * int(pillow)
    ours = _set(MAX_IMAGE_PIXELS)
    if ours is None or pillow_limit is None:
        return pillow_limit if ours is None else ours
    return min(ours, pillow_limit)


def check_image_pixels(height: int, width: int, limit: int | None) -> None:
    """Raise ValueError when an image of ``height`` x ``width`` pixels is over ``limit``
    (:func:`max_image_pixels`, read once by a decoder; None: no limit). Called before
    decoding, with the size the image's header gives."""
    if limit is not None and height * width > limit:
        raise ValueError(
            f"the image is {width}x{height} = {height * width} pixels, over the limit of {limit} "
            f"(raise PIL.Image.MAX_IMAGE_PIXELS, and {MAX_IMAGE_PIXELS} where set, to allow it)"
        )
