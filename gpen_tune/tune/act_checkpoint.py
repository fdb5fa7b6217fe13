"""--checkpoint: the honest inference-memory saver (not autograd checkpointing).

Why not torch.utils.checkpoint: activation checkpointing trades recomputation for the activations autograd keeps
for the backward pass. Under `torch.no_grad()` / `inference_mode()` nothing is kept for backward, so it saves
nothing at inference (upstream, measured). GPEN's real inference peak is different: every encoder feature map is held
from the encoder pass until the decoder reaches its resolution (they are concatenated as "noise"), and the
largest ones (ecd0 at S x S, ecd1 at S/2 x S/2) are needed only by the last decoder levels, exactly where the
decoder's own tensors are widest.
What changes (activation peaks traced on the CPU by `gpen_tune.tune.live_memory`; weights and input excluded):
1. `FullGenerator.release_features = True`: each encoder feature is dropped after its last use and ecd0/ecd1 are
   recomputed from the input when the last two decoder levels need them (their convs are the cheapest: a 1x1 conv
   from 3 channels and one strided 3x3), so the peak no longer holds them across the decoder.
2. `StyledConv.low_memory = True`: the encoder feature is scaled inside the concatenation buffer instead of in a
   temporary (one C-channel map less at each level's peak, one extra pass over it).
GPEN-512 at batch 1, fp32: 462 -> 385 MiB (-17%); the tiny test config 14.6 -> 12.1 MiB. (The in-place bias +
leaky ReLU + gain that this switch used to add is now the model's default arithmetic, see model/layers.py: the
default itself went from 635 to 462 MiB.) On the GPU, `bench` measures the real peak (allocator rounding and
cuDNN workspaces included).
Tolerance: identical output in fp32 up to float rounding (the same products, summed in another order: tested
to 1e-5).
Cost: ecd0 + ecd1 run twice, a few percent of the FLOPs.
Fallback: a module without `release_features` (e.g. a fused module that does not implement it) is left alone
and the restorer records why.
Fine-tuning (gradients on) is not part of gpen-tune; `checkpointed_forward` is kept for that case only.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpen_tune.model.layers import StyledConv
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig


def use_low_memory_concat(model: nn.Module, on: bool = True) -> int:
    """Set `low_memory` on every StyledConv of `model` (feature scaled inside the concat buffer); returns how many."""
    n = 0
    for mod in model.modules():
        if isinstance(mod, StyledConv):
            mod.low_memory = on
            n += 1
    return n


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    return None  # plain tensor code: every device


def lower_peak(model: nn.Module, on: bool = True) -> str | None:
    """`release_features` and the in-concat scaling on the generator; the reason when it cannot take them."""
    if not hasattr(model, "release_features"):
        return f"{type(model).__name__} has no release_features mode; --checkpoint has no effect on it"
    if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
        return "the model has trainable parameters: in-place inference ops would break backward"
    model.release_features = on
    use_low_memory_concat(model, on)
    return None


def apply(done: Applied) -> None:
    """Set the flags on the generator itself, before anything wraps it; skipped with the reason when it cannot."""
    reason = lower_peak(done.model)
    if reason:
        done.skip("act_checkpoint", reason)


def checkpointed_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Gradient-enabled forward with autograd checkpointing of each encoder stage (fine-tuning only).

    Only meaningful when `torch.is_grad_enabled()`; at inference use `lower_peak` (release_features) instead.
    """
    if not torch.is_grad_enabled():
        return model(x)
    saved = model.release_features
    model.release_features = False
    try:
        h = x.to(model.compute_dtype)
        feats = []
        for ecd in model.encoder:
            h = checkpoint(ecd, h, use_reentrant=False)
            feats.append(h)
        z = model.final_linear(h.flatten(1))
        noise = [f for f in reversed(feats) for _ in range(2)][1:]
        return model.generator(z, noise, h.dtype)
    finally:
        model.release_features = saved
