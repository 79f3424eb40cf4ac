"""wdsx inside trainers: PyTorch Lightning (:mod:`.lightning`), ``torch.distributed.checkpoint``
(:mod:`.dcp`) and Hugging Face Accelerate (:mod:`.accelerate`).

Each module imports its framework, so import the one you use; ``import wdsx`` imports none of
them (nor torch).
"""
