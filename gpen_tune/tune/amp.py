"""--amp bf16|fp16: cast the generator's conv weights to half precision, keep fp32 islands where it matters.

What changes: every conv weight and the activations run in bf16/fp16 (half the bytes, tensor-core rate).
What stays fp32: the mapping network and `final_linear` (the style path), the per-layer styles and demodulation
coefficients (a sum of cin*k*k squares overflows fp16), the RGB skip accumulation (ToRGB returns fp32).
Inputs are converted once at the model's entry, outputs are fp32. Not autocast: autocast re-casts weights on
every call and GPEN's fp32 biases promote activations back to fp32 (see measured.md: 3-5x slower).
"""

from __future__ import annotations

import torch
from torch import nn

from gpen_tune.model.layers import EqualLinear, ToRGB

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": torch.float32}


def cast_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast in place every parameter except EqualLinear's and ToRGB biases to `dtype`; returns the model."""
    keep: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, EqualLinear):
            keep.update(id(p) for p in mod.parameters(recurse=False))
        if isinstance(mod, ToRGB):
            keep.add(id(mod.bias))
    for mod in model.modules():
        for p in list(mod.parameters(recurse=False)):
            if id(p) not in keep and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return model
