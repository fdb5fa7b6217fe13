"""Max pooling with `ceil_mode=True` as strided maxima, for MTCNN's networks on the CPU.

ATen's CPU `max_pool2d` always computes the argmax indices too (`max_pool2d_with_indices`) and is slow on NCHW
tensors: with the maxima of shifted views instead, MTCNN detects the Solvay photo in 334 ms instead of 481 on one
thread (benchmarks/detector_cpu.py; benchmarks/RESULTS.md, "The face detector on the CPU"). A maximum is exact in
any order, so the values are those of `F.max_pool2d` to the bit (NaN included). Elsewhere (CUDA) the ATen op runs:
its kernel is not the one measured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _every(x: torch.Tensor, dim: int, start: int, count: int, stride: int) -> torch.Tensor:
    """The view of `count` cells along `dim`, from `start`, `stride` apart."""
    span = x.narrow(dim, start, (count - 1) * stride + 1)
    return span[(slice(None),) * dim + (slice(None, None, stride),)]


def _along(x: torch.Tensor, dim: int, kernel: int, stride: int, fmt: torch.memory_format) -> torch.Tensor:
    """Windowed maxima along one spatial dim: windows of `kernel` every `stride`, each starting inside the input,
    the last allowed past its end (ceil mode: only the cells inside count). No padded copy: each offset of the
    window updates the windows it reaches, in place."""
    n = x.shape[dim]
    out = -(-(n - kernel) // stride) + 1 if n >= kernel else 1
    shape = list(x.shape)
    shape[dim] = out
    result = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    result.copy_(_every(x, dim, 0, out, stride))
    for t in range(1, kernel):
        count = min(out, -(-(n - t) // stride))            # the windows whose cell t is inside
        if count > 0:
            dst = result.narrow(dim, 0, count)
            torch.maximum(dst, _every(x, dim, t, count, stride), out=dst)
    return result


def max_pool_ceil(x: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """`F.max_pool2d(x, kernel, stride, ceil_mode=True)` of an [N, C, H, W] tensor, in the memory format ATen's
    kernel gives (the next convolution's arithmetic depends on it)."""
    if x.device.type != "cpu":
        return F.max_pool2d(x, kernel, stride, ceil_mode=True)
    channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return _along(_along(x, 3, kernel, stride, fmt), 2, kernel, stride, fmt)


class MaxPoolCeil(nn.Module):
    """`nn.MaxPool2d(kernel, stride, ceil_mode=True)` through `max_pool_ceil`."""

    def __init__(self, kernel: int, stride: int):
        super().__init__()
        self.kernel, self.stride = kernel, stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_pool_ceil(x, self.kernel, self.stride)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, stride={self.stride}, ceil_mode=True"
