"""Stand-in: see torchvision/__init__.py. ``InterpolationMode`` has torchvision's members."""

import enum

from torchvision._placeholders import placeholder_getattr

__getattr__ = placeholder_getattr(__name__)


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"
