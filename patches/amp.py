"""Patch `amp` for upstream yangxy/GPEN 2c73670: bf16/fp16 generator with fp32 islands, inside FaceGAN.

Not autocast: upstream's compiled CUDA ops raise under autocast, and on the pure-PyTorch path autocast made the
generator 3-5x slower (grouped conv and depthwise FIR in half; upstream, measured). Instead, once in
FaceGAN.load_model (via `generator-runner`): weights and activations are cast to the half dtype, while every
EqualLinear (mapping network, final_linear, per-layer style modulation) and the RGB-skip upsampling stay fp32
with their inputs converted on entry; ModulatedConv2d uses the batch-friendly formulation with styles and
demodulation coefficients computed in fp32 and ToRGB returning fp32, so the RGB skip sum is fp32. The input
is converted once at the entry and the output is fp32. Pulls in `native-ops` (no CUDA build, no per-call
platform test). Switch: GPEN_TUNE_AMP=bf16|fp16 or demo.py --amp bf16|fp16. Off: fp32, upstream code path.
"""

from __future__ import annotations

from gpen_tune.patcher.spec import Patch

PATCH = Patch(
    name="amp",
    summary="bf16/fp16 weight cast with fp32 islands (styles, demodulation, RGB skip) in FaceGAN",
    switches=("GPEN_TUNE_AMP",),
    requires=("runtime", "native-ops", "generator-runner"),
)
