"""--onednn: the fused generator in its oneDNN form on the CPU (`gpen_tune.model.fused_onednn`), with --fused.

What changes: instead of the fused generator's PyTorch passes between its convolutions, every conv is one oneDNN
call with its bias and leaky ReLU fused in; demodulation and gain stay pending per channel, the style scales the
smaller of a conv's weight and input, the up-conv runs as one ordinary 2x2 phase conv, constant weights are
prepacked in oneDNN's layout.
Why it helps: on a 2-core AMX-BF16 Xeon the fused generator spent ~50 % of a batch-1 call in elementwise passes
between its convolutions (benchmarks/RESULTS.md, "The generator on the CPU").
Tolerance: the fused generator's (same function; bf16 ~51 dB PSNR vs fp32 on GPEN-BFR-256, fp32 max-abs < 1e-5).
Fallback: a build failure -> the fused module's PyTorch passes, recorded in the restorer's fallbacks.
"""

from __future__ import annotations

import torch

from gpen_tune.model.fused_onednn import available
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    if torch.device(device).type != "cpu":
        return "the oneDNN form is the CPU's (GPUs run the fused generator's Triton kernels)"
    if not cfg.fused:
        return "it is a form of the fused generator: add --fused"
    return available()


def apply(done: Applied) -> None:
    """Nothing here: the fused switch builds the oneDNN form (`fused.apply` asks `done.on("onednn")`)."""
