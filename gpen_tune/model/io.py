"""The generator's input and output convention: HWC uint8 RGB crops (host or device) <-> NCHW in [-1, 1] in the
model's dtype, and how two outputs in that range are compared (PSNR, max-abs) by the bench, the export's check and
the tests.

Both conversions run on the device when the crops are there (a quarter of the bytes of float32 cross the bus).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch


def stack_crops(crops: Sequence[np.ndarray | torch.Tensor], device: torch.device) -> torch.Tensor:
    """[S,S,3] uint8 crops (numpy or tensors, anywhere) -> one [B,S,S,3] uint8 tensor on `device`."""
    if all(isinstance(c, torch.Tensor) for c in crops):
        return torch.stack([c.to(device) for c in crops])
    if any(isinstance(c, torch.Tensor) for c in crops):
        return torch.stack([torch.as_tensor(c).to(device) for c in crops])
    return torch.from_numpy(np.stack(crops)).to(device, non_blocking=True)


def to_model_input(u8_nhwc: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B,S,S,3] uint8 RGB (any device) -> [B,3,S,S] in [-1, 1], `dtype`, same device."""
    return (u8_nhwc.permute(0, 3, 1, 2).to(dtype) / 127.5 - 1.0).contiguous()


def to_uint8_nhwc(out: torch.Tensor) -> torch.Tensor:
    """[B,3,S,S] generator output -> [B,S,S,3] uint8 RGB, same device: clip((y + 1) / 2) * 255, rounded."""
    y = ((out.float() + 1.0) * 0.5).clamp_(0.0, 1.0).mul_(255.0).round_()
    return y.to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def keep_input_where(finite: torch.Tensor, out_u8: torch.Tensor, in_u8: torch.Tensor) -> torch.Tensor:
    """out_u8 with the rows whose `finite` flag is False replaced by the input crop (no host sync)."""
    return torch.where(finite.view(-1, 1, 1, 1), out_u8, in_u8)


def psnr(out: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR in dB of images in [-1,1] (clamped as they would be saved), peak = 1 after mapping to [0,1]."""
    a = (out.float().clamp(-1, 1) + 1) / 2
    b = (ref.float().clamp(-1, 1) + 1) / 2
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


def max_abs(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max())
