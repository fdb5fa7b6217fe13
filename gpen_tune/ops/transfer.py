"""Host <-> device helpers shared by the detector and the folder runner's threads."""

from __future__ import annotations

import threading

import numpy as np
import torch

_local = threading.local()


def to_device_async(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host array on the device without a host sync: a plain (pageable) CUDA upload waits for the stream
    to drain, a pinned non_blocking one does not (the pinned buffer is kept until the copy is done)."""
    if device.type != "cuda":
        return torch.as_tensor(array, device=device)
    return torch.from_numpy(np.ascontiguousarray(array)).pin_memory().to(device, non_blocking=True)


def thread_stream(device: torch.device | str) -> torch.cuda.Stream:
    """One CUDA stream per calling thread (prepare and finish workers): their copies and paste-back kernels do
    not queue behind the generator on the default stream."""
    key = str(torch.device(device))
    if getattr(_local, "key", None) != key:
        _local.stream, _local.key = torch.cuda.Stream(device=device), key
    return _local.stream
