"""--checkpoint: the honest inference-memory saver (not autograd checkpointing).

Why not torch.utils.checkpoint: activation checkpointing trades recomputation for the activations autograd keeps
for the backward pass. Under `torch.no_grad()` / `inference_mode()` nothing is kept for backward, so it saves
nothing at inference (measured.md). GPEN's real inference peak is different: every encoder feature map is held
from the encoder pass until the decoder reaches its resolution (they are concatenated as "noise"), and the
largest ones (ecd0 at S x S, ecd1 at S/2 x S/2) are needed only by the last decoder levels, exactly where the
decoder's own tensors are widest.
What changes, two measured parts (activation peak of GPEN-256 at batch 2, traced on the CPU by
`gpen_tune.tune.live_memory`: 159 MiB -> 111 MiB with the in-place ops -> 96 MiB with both, -39%):
1. In-place activations: every bias + leaky ReLU + gain (FusedLeakyReLU, 2 full-size temporaries per layer) runs in
   place on its fresh input, and the encoder feature is scaled inside the concatenation buffer instead of in a
   temporary (NoiseInjection). The modules' classes are swapped for in-place subclasses: same parameters, same
   state-dict keys, same arithmetic in the same order.
2. `FullGenerator.release_features = True`: each encoder feature is dropped after its last use and ecd0/ecd1 are
   recomputed from the input when the last two decoder levels need them (their convs are the cheapest: a 1x1 conv
   from 3 channels and one strided 3x3), so the peak no longer holds them across the decoder.
Tolerance: identical output (same ops on the same values; bit-exact in eager fp32, tested).
Cost: ecd0 + ecd1 run twice, a few percent of the FLOPs; in-place ops are, if anything, faster.
Fallback: a module without `release_features` (e.g. a fused module that does not implement it) is left alone
and the restorer records why.
Fine-tuning (gradients on) is not part of gpen-tune; `checkpointed_forward` is kept for that case only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.model.layers import FusedLeakyReLU, NoiseInjection
from gpen_tune.tune.options import TuneConfig

_GAIN = math.sqrt(2.0)


class InplaceFusedLeakyReLU(FusedLeakyReLU):
    """sqrt(2) * leaky_relu(x + bias) computed in x's own memory (x must be a fresh tensor nobody else reads)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = [1, -1] + [1] * (x.dim() - 2)
        x = x.add_(self.bias.to(x.dtype).view(shape))
        return F.leaky_relu_(x, 0.2).mul_(_GAIN)


class ScaledConcatNoise(NoiseInjection):
    """cat([image, noise * weight]) with the scaling done inside the concatenation buffer (no temporary)."""

    def forward(self, image: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        channels = image.shape[1]
        out = torch.cat([image, noise.to(image.dtype)], dim=1)
        out[:, channels:].mul_(self.weight.to(image.dtype))
        return out


_INPLACE = {FusedLeakyReLU: InplaceFusedLeakyReLU, NoiseInjection: ScaledConcatNoise}


def use_inplace_ops(model: nn.Module) -> int:
    """Swap every FusedLeakyReLU / NoiseInjection of `model` for its in-place twin; returns how many."""
    swapped = 0
    for mod in model.modules():
        twin = _INPLACE.get(type(mod))
        if twin is not None:
            mod.__class__ = twin
            swapped += 1
    return swapped


def is_supported(device: str | torch.device, cfg: TuneConfig | None = None) -> str | None:
    return None  # plain tensor code: every device


def apply(model: nn.Module, cfg: TuneConfig) -> str | None:
    """In-place activations + `release_features` on the generator; the reason when the module is not a GPEN."""
    if not hasattr(model, "release_features"):
        return f"{type(model).__name__} has no release_features mode; --checkpoint has no effect on it"
    if torch.is_grad_enabled() and any(p.requires_grad for p in model.parameters()):
        return "the model has trainable parameters: in-place inference ops would break backward"
    model.release_features = bool(cfg.act_checkpoint)
    if cfg.act_checkpoint:
        use_inplace_ops(model)
    return None


def checkpointed_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Gradient-enabled forward with autograd checkpointing of each encoder stage (fine-tuning only).

    Only meaningful when `torch.is_grad_enabled()`; at inference use `apply` (release_features) instead.
    """
    from torch.utils.checkpoint import checkpoint

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
