"""--fused: the fused generator of `gpen_tune.model.fused` (benchmarks/RESULTS.md has its measurements); with
--onednn on the CPU, its oneDNN form (`gpen_tune.model.fused_onednn`).

What changes: `fuse(model, dtype)` returns a module with FullGenerator's forward contract built from the fp32
weights: style-independent weight transforms precomputed, channels-last, and after every conv one Triton pass
(FIR blur, demodulation, bias, leaky ReLU, gain, the encoder-feature half of the concat, the next conv's style
scaling), ToRGB as a per-sample reduction; on a device without Triton the PyTorch twins of those passes run.
Tolerance: max-abs <= 1e-3 vs the unfused module in fp32 (tests/model/test_fast.py holds it to that).
Fallback: a build failure -> the unfused module, recorded in the restorer's fallbacks.
"""

from __future__ import annotations

import torch

from gpen_tune.model.fused import fuse
from gpen_tune.model.fused_onednn import fuse_onednn
from gpen_tune.tune import amp
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    return None  # the PyTorch twins run anywhere


def apply(done: Applied) -> None:
    """The fused module from the fp32 weights; then the generator (the NaN fallback's template) is cast to the
    amp dtype, or moved to the meta device where the run needs no second resident copy of the weights."""
    dtype = amp.AMP_DTYPES[done.cfg.amp] if done.on("amp") else None
    if done.on("onednn"):                          # the CPU form (`gpen_tune.tune.onednn`)
        try:
            done.forward = fuse_onednn(done.model, dtype=dtype)
        except Exception as e:
            done.skip("onednn", f"the oneDNN form failed to build ({type(e).__name__}: {str(e)[:200]}); "
                                "using the fused PyTorch passes")
    try:
        if not done.on("onednn"):
            done.forward = fuse(done.model, dtype=dtype)
    except Exception as e:
        done.skip("fused", f"the fused generator failed to build ({type(e).__name__}: {str(e)[:200]}); "
                           "using the unfused model")
        done.forward = done.model
    if dtype is None:
        if done.on("fused"):
            # fp32: no re-run to fall back to (a non-finite face keeps its input crop), so the fused module holds
            # the only weights the run needs; the template keeps its structure on the meta device
            done.model.to("meta")
            done.notes.append("fused fp32: one resident copy of the weights")
        return
    keep = amp.keeps_fp32_originals(done.device, done.cfg)
    done.model, done.reserve = amp.cast_with_reserve(done.model, done.cfg, keep)
    if not done.on("fused"):
        done.forward = done.model
    elif not keep:
        # bf16 on the CPU: no fp32 re-run (bf16 cannot overflow), so the fused module holds the only weights the
        # run needs; the template keeps its structure and dtype on the meta device
        done.model.to("meta")
        done.reserve = None
        done.notes.append("fused bf16 on the CPU: one resident copy of the weights, no fp32 re-run "
                          "(a non-finite face keeps its input crop)")
