"""Host <-> device helpers shared by the detector and the folder runner's threads."""

from __future__ import annotations

import threading
from collections.abc import Sequence

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


def pinned_stack(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Same-shape uint8 arrays copied into one page-locked host block by the calling thread; returns views of it.

    Why: a worker thread does the copy (it is off the critical path), and the thread that later uploads the
    arrays (the detector's or the GPU stage's, each the bottleneck of a folder run at times) only queues DMA
    copies from them: one torch call for many arrays (`upload_into`) instead of one numpy copy each, which
    also re-takes the GIL after every copy. The views keep the block alive; it goes back to torch's pinned
    memory cache when the last one is dropped. CUDA only (page-locking needs the driver)."""
    if not arrays:
        return []
    block = torch.empty((len(arrays), *arrays[0].shape), dtype=torch.uint8, pin_memory=True)
    view = block.numpy()
    for i, a in enumerate(arrays):
        view[i] = a
    return list(view)


def upload_into(targets: Sequence[torch.Tensor], arrays: Sequence[np.ndarray]) -> None:
    """targets[i].copy_(arrays[i]) for all i, asynchronously, in one torch call (one GIL release).

    Arrays in page-locked memory (`pinned_stack`) are DMA-copied without a host sync; pageable ones are staged by
    the driver (correct, only slower). The arrays must stay unchanged until the copies have run on the stream."""
    sources = [torch.from_numpy(a) for a in arrays]
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(list(targets), sources, non_blocking=True)
        return
    for t, src in zip(targets, sources, strict=True):     # pragma: no cover - torch without _foreach_copy_
        t.copy_(src, non_blocking=True)
