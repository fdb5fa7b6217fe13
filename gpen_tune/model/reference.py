"""The upstream (per-sample) formulation of GPEN's forward, on our FullGenerator's parameters.

Upstream builds, for every sample and layer, the modulated and demodulated weight W'[b] = d[b] * W * s[b] and runs
one grouped convolution with groups = batch (transposed for the up-convs), then the FIR; the concatenated encoder
feature, bias and leaky ReLU follow as separate passes. This is the fidelity reference of the fast path's
benchmark ("upstream-equivalent fp32 eager") and a second, differently written oracle for its tests.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.model.gpen import FullGenerator
from gpen_tune.ops.fir import fused_leaky_relu, upfirdn2d


def _modulated(conv: nn.Module, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """ModulatedConv2d with per-sample weights and a grouped conv (groups = batch)."""
    bsz, cin, h, wd = x.shape
    style = conv.modulation(w).to(x.dtype)                                    # [B, cin]
    weight = conv.weight.to(x.dtype) * conv.scale * style[:, None, :, None, None]   # [B, cout, cin, k, k]
    if conv.demodulate:
        weight = weight * torch.rsqrt(weight.square().sum(dim=(2, 3, 4)) + 1e-8)[:, :, None, None, None]
    cout, k = weight.shape[1], weight.shape[-1]
    xg = x.reshape(1, bsz * cin, h, wd)
    if conv.upsample:
        wt = weight.transpose(1, 2).reshape(bsz * cin, cout, k, k)
        out = F.conv_transpose2d(xg, wt, stride=2, groups=bsz)
        out = out.reshape(bsz, cout, *out.shape[2:])
        return upfirdn2d(out, conv.blur.kernel, pad=conv.blur.pad)
    out = F.conv2d(xg, weight.reshape(bsz * cout, cin, k, k), padding=conv.padding, groups=bsz)
    return out.reshape(bsz, cout, *out.shape[2:])


def _styled(sc: nn.Module, x: torch.Tensor, w: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
    out = _modulated(sc.conv, x, w)
    out = torch.cat([out, sc.noise.weight.to(out.dtype) * feat.to(out.dtype)], dim=1)
    return fused_leaky_relu(out, sc.activate.bias)


def _to_rgb(t: nn.Module, x: torch.Tensor, w: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
    out = _modulated(t.conv, x, w).float() + t.bias.float()
    if skip is not None:
        out = out + t.upsample(skip)
    return out


@torch.no_grad()
def reference_forward(model: FullGenerator, x: torch.Tensor) -> torch.Tensor:
    """FullGenerator's function, computed the upstream way (per-sample grouped convs) in the model's dtype."""
    x = x.to(model.compute_dtype)
    feats = []
    h = x
    for ecd in model.encoder:
        h = ecd(h)
        feats.append(h)
    g = model.generator
    w = g.style(model.final_linear(h.flatten(1)))
    noise = [f for f in reversed(feats) for _ in range(2)][1:]
    out = g.input(x.shape[0]).to(x.dtype)
    out = _styled(g.conv1, out, w, noise[0])
    skip = _to_rgb(g.to_rgb1, out, w, None)
    for level, t in enumerate(g.to_rgbs):
        out = _styled(g.convs[2 * level], out, w, noise[2 * level + 1])
        out = _styled(g.convs[2 * level + 1], out, w, noise[2 * level + 2])
        skip = _to_rgb(t, out, w, skip)
    return skip


class ReferenceGenerator(nn.Module):
    """Module wrapper of `reference_forward` (shares the model's parameters)."""

    def __init__(self, model: FullGenerator):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reference_forward(self.model, x)
