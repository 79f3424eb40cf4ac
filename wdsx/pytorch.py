"""webdataset's ``pytorch`` module: torch's ``IterableDataset``, ``DataLoader`` and ``Tensor``
(as ``TorchTensor``), imported only when one of them is used, so ``import wdsx`` stays
torch-free. Without torch, stand-in classes let code subclass them, as in webdataset."""

from wdsx.core.faces import TORCH_NAMES, torch_names

__getattr__ = torch_names(__name__)

__all__ = list(TORCH_NAMES)
