"""A stand-in for torchvision, for the client corpus only.

torchvision's wheels on the package index are built against torch's CUDA build: next to the
CPU torch of this virtualenv their compiled operators do not load and ``import torchvision``
fails (and installing them with their dependencies would replace torch). The clients import
torchvision at module level (timm for its transforms, layers and datasets, open_clip_train
for ``torchvision.datasets``), but their webdataset data paths call none of it: the scenarios
pass their own image transform. So each module here only lets those imports succeed: every
name it is asked for is a placeholder class that raises if it is ever instantiated, except
``InterpolationMode``, whose members timm reads while it is imported.
"""

from torchvision._placeholders import placeholder_getattr

__getattr__ = placeholder_getattr(__name__)
