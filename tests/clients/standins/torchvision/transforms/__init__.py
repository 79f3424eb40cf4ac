"""Stand-in: see torchvision/__init__.py."""

from torchvision._placeholders import placeholder_getattr
from torchvision.transforms.functional import InterpolationMode

__getattr__ = placeholder_getattr(__name__)

__all__ = ["InterpolationMode"]
