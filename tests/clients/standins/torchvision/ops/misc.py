"""Stand-in: see torchvision/__init__.py."""

from torchvision._placeholders import placeholder_getattr

__getattr__ = placeholder_getattr(__name__)
