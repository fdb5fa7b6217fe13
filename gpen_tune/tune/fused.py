"""--fused: hand the generator to `gpen_tune.fast.fuse`, the fused fast path (gpen_tune/fast/NOTES.md).

What changes: `fuse(model, dtype)` returns a module with FullGenerator's forward contract built from the fp32
weights: style-independent weight transforms precomputed, channels-last, and after every conv one Triton pass
(FIR blur, demodulation, bias, leaky ReLU, gain, the encoder-feature half of the concat, the next conv's style
scaling), ToRGB as a per-sample 1x1 matmul. Imported only when the switch is on.
Tolerance: max-abs <= 1e-3 vs the unfused module in fp32 (fast's own tests hold it to that).
Fallback: gpen_tune.fast missing or failing -> the unfused module, recorded in the restorer's fallbacks.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import nn

from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig | None = None) -> str | None:
    if importlib.util.find_spec("gpen_tune.fast") is None:
        return "gpen_tune.fast (the fused kernels) is not installed in this build"
    return None


def apply(model: nn.Module, cfg: TuneConfig, dtype: torch.dtype | None = None) -> nn.Module:
    from gpen_tune.fast import fuse

    return fuse(model, dtype=dtype)
