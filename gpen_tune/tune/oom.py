"""The one out-of-memory predicate: the switches re-raise these (the restorer splits the batch), never fall back."""

from __future__ import annotations

import torch


def is_out_of_memory(exc: BaseException) -> bool:
    """A CUDA (or host) allocation failure, whatever the torch version or library (cuDNN, cuBLAS) calls it."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
