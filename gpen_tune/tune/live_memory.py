"""Peak bytes of live tensors during a call, on any device (the CPU has no allocator statistics).

A TorchDispatchMode sees every tensor an op returns; each new storage is counted until the last tensor using it
dies (weakref finalizers). Storages that exist before the call (weights, buffers, the input) are not counted:
the result is the activation peak, what `--act-checkpoint` and `--amp` change. Allocator rounding, cuDNN
workspaces and the caching allocator's reserve are not included; on CUDA prefer torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _LiveBytes(TorchDispatchMode):
    def __init__(self, external: set[int]):
        super().__init__()
        self.external = external
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in self.external:
            return
        if key not in self.refs:
            self.refs[key] = 0
            self.sizes[key] = storage.nbytes()
            self.current += self.sizes[key]
            self.peak = max(self.peak, self.current)
        self.refs[key] += 1
        weakref.finalize(t, self._release, key)

    def _release(self, key: int) -> None:
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.current -= self.sizes.pop(key)
            del self.refs[key]


def peak_live_bytes(fn: Callable[[], object], existing: Iterable[torch.Tensor] = ()) -> int:
    """Run fn() and return the peak bytes of tensors it created that were alive at the same time."""
    external = {t.untyped_storage().data_ptr() for t in existing}
    mode = _LiveBytes(external)
    with mode:
        result = fn()
    del result
    return mode.peak


def generator_activation_peak(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Peak activation bytes of one no_grad forward of `model` on `x` (weights and input excluded)."""
    existing = [*model.parameters(), *model.buffers(), x]
    with torch.no_grad():
        return peak_live_bytes(lambda: model(x), existing)
