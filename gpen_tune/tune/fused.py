"""--fused: the fused generator of `gpen_tune.model.fused` (benchmarks/RESULTS-fast.md has its measurements).

What changes: `fuse(model, dtype)` returns a module with FullGenerator's forward contract built from the fp32
weights: style-independent weight transforms precomputed, channels-last, and after every conv one Triton pass
(FIR blur, demodulation, bias, leaky ReLU, gain, the encoder-feature half of the concat, the next conv's style
scaling), ToRGB as a per-sample reduction; on a device without Triton the PyTorch twins of those passes run.
Tolerance: max-abs <= 1e-3 vs the unfused module in fp32 (tests/model/test_fast.py holds it to that).
Fallback: a build failure -> the unfused module, recorded in the restorer's fallbacks.
"""

from __future__ import annotations

import torch
from torch import nn

from gpen_tune.model.fused import fuse
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig | None = None) -> str | None:
    return None  # the PyTorch twins run anywhere


def apply(model: nn.Module, cfg: TuneConfig, dtype: torch.dtype | None = None) -> nn.Module:
    return fuse(model, dtype=dtype)
