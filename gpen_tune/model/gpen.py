"""GPEN (Yang et al., CVPR 2021): a U-shaped face restorer whose decoder is a StyleGAN2 generator.

The encoder (`ecd0` ... `ecd{L-2}`) maps the degraded face to a latent code and keeps a feature map per
resolution; the decoder (`generator`) synthesises from a learned constant, modulated by the mapped latent w, and
concatenates the encoder feature of each resolution after every modulated conv (where StyleGAN2 adds noise).

Written from upstream GPEN's published architecture (commit 2c73670); module paths reproduce the state
dict of the released checkpoints, so they load with strict=True.
"""

from __future__ import annotations

import torch
from torch import nn

from gpen_tune.model.configs import GPENConfig
from gpen_tune.model.layers import (
    ConstantInput,
    ConvLayer,
    EqualLinear,
    PixelNorm,
    StyledConv,
    ToRGB,
    cached_per_weights,
)

# ---------------------------------------------------------------------------------------------------------------


class Generator(nn.Module):
    """StyleGAN2 synthesis network with concatenated 'noise' (GPEN's encoder features)."""

    def __init__(self, cfg: GPENConfig):
        super().__init__()
        self.size = cfg.size
        self.style_dim = cfg.style_dim
        self.log_size = cfg.log_size
        self.n_latent = cfg.n_latent
        ch = cfg.channels
        self.channels = ch
        blur = cfg.blur_kernel

        self.style = nn.Sequential(
            PixelNorm(),
            *[EqualLinear(cfg.style_dim, cfg.style_dim, lr_mul=cfg.lr_mlp, activation="fused_lrelu")
              for _ in range(cfg.n_mlp)],
        )
        self.input = ConstantInput(ch[4])
        self.conv1 = StyledConv(ch[4], ch[4], 3, cfg.style_dim, blur_kernel=blur)
        self.to_rgb1 = ToRGB(ch[4] * 2, cfg.style_dim, upsample=False)

        self.convs = nn.ModuleList()
        self.upsamples = nn.ModuleList()  # empty, kept for parity with the upstream module tree
        self.to_rgbs = nn.ModuleList()
        in_channel = ch[4]
        for i in range(3, self.log_size + 1):
            out_channel = ch[2**i]
            self.convs.append(StyledConv(in_channel * 2, out_channel, 3, cfg.style_dim, upsample=True,
                                         blur_kernel=blur))
            self.convs.append(StyledConv(out_channel * 2, out_channel, 3, cfg.style_dim, blur_kernel=blur))
            self.to_rgbs.append(ToRGB(out_channel * 2, cfg.style_dim))
            in_channel = out_channel
        self._stacked: tuple | None = None   # cache of the stacked style weights (layer_styles)

    def forward(self, z: torch.Tensor, noise: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """Map z -> w, then synthesise. `noise[k]` is the encoder feature for the k-th styled conv."""
        w = self.style(z)                                              # [B, style_dim], same w for every layer
        styles = iter(self.layer_styles(w))
        x = self.input(w.shape[0]).to(dtype)
        x = self.conv1(x, w, noise[0], style=next(styles))
        skip = self.to_rgb1(x, w, style=next(styles))
        for level, to_rgb in enumerate(self.to_rgbs):
            conv_up, conv = self.convs[2 * level], self.convs[2 * level + 1]
            x = conv_up(x, w, noise[2 * level + 1], style=next(styles))
            x = conv(x, w, noise[2 * level + 2], style=next(styles))
            skip = to_rgb(x, w, skip, style=next(styles))
        return skip

    def modulations(self) -> list[EqualLinear]:
        """Every modulated conv's affine layer A, in the order forward uses them."""
        order = [self.conv1, self.to_rgb1]
        for level, to_rgb in enumerate(self.to_rgbs):
            order += [self.convs[2 * level], self.convs[2 * level + 1], to_rgb]
        return [m.conv.modulation for m in order]

    def layer_styles(self, w: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's style s = A(w), for all layers in one GEMM (GPEN feeds the same w to every layer): the
        affine weights stacked once (cached while they are unchanged), one addmm instead of one small GEMM per
        layer (23 for GPEN-512; at batch 1 each is a launch-bound GEMV). Same values as each layer's A(w)."""
        mods = self.modulations()
        first = mods[0]
        if any(m.weight.dtype != first.weight.dtype or m.scale != first.scale or m.lr_mul != first.lr_mul
               or m.bias is None or m.activation for m in mods):
            return [m(w) for m in mods]                                # not the GPEN layout: one GEMM per layer
        tensors = tuple(t for m in mods for t in (m.weight, m.bias))
        self._stacked, (weight, bias) = cached_per_weights(
            self._stacked, tensors,
            lambda: (torch.cat([m.weight for m in mods]), torch.cat([m.bias for m in mods])))
        x = w.to(weight.dtype)
        s = torch.addmm(bias, x, weight.t(), beta=first.lr_mul, alpha=first.scale)
        return list(s.split([m.weight.shape[0] for m in mods], dim=1))


class FullGenerator(nn.Module):
    """GPEN: encoder + mapping + StyleGAN2 decoder. forward: [B,3,S,S] RGB in [-1,1] -> [B,3,S,S] fp32, unclamped.

    The compute dtype is the dtype of the conv weights (fp32, or bf16/fp16 after `gpen_tune.tune.amp`); the input
    is converted to it once and the output is fp32.

    `release_features` (set by `gpen_tune.tune.act_checkpoint`): instead of holding every encoder feature until
    the decoder reaches its resolution (upstream's behaviour), drop each feature after its last use and recompute
    the largest, cheapest ones (`ecd0`, `ecd1`) when the decoder needs them; the output is the same.
    """

    def __init__(self, cfg: GPENConfig, release_features: bool = False):
        super().__init__()
        self.cfg = cfg
        self.size = cfg.size
        self.log_size = cfg.log_size
        self.release_features = release_features
        ch = cfg.channels

        self.generator = Generator(cfg)
        self.ecd0 = nn.Sequential(ConvLayer(3, ch[cfg.size], 1))
        in_channel = ch[cfg.size]
        for i in range(self.log_size, 2, -1):
            out_channel = ch[2 ** (i - 1)]
            setattr(self, f"ecd{self.log_size - i + 1}",
                    nn.Sequential(ConvLayer(in_channel, out_channel, 3, downsample=True, blur_kernel=cfg.blur_kernel)))
            in_channel = out_channel
        self.final_linear = nn.Sequential(EqualLinear(ch[4] * 16, cfg.style_dim, activation="fused_lrelu"))

    @property
    def encoder(self) -> list[nn.Module]:
        return [getattr(self, f"ecd{i}") for i in range(self.log_size - 1)]

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.ecd0[0][0].weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.compute_dtype)
        return self._forward_release(x) if self.release_features else self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = []
        h = x
        for ecd in self.encoder:
            h = ecd(h)
            feats.append(h)                                          # f0 (S x S) ... f_{L-2} (4 x 4)
        z = self.final_linear(h.flatten(1))
        # noise order: f_{L-2}, then every coarser-to-finer feature twice (two styled convs per resolution)
        noise = [f for f in reversed(feats) for _ in range(2)][1:]
        return self.generator(z, noise, x.dtype)

    def _forward_release(self, x: torch.Tensor) -> torch.Tensor:
        """Same output; keeps only the small encoder features alive, recomputes f0 and f1 at the last levels."""
        encoder = self.encoder
        n_recompute = min(2, len(encoder) - 1)
        kept: list[torch.Tensor | None] = []
        h = x
        for i, ecd in enumerate(encoder):
            h = ecd(h)
            kept.append(None if i < n_recompute else h)
        z = self.final_linear(h.flatten(1))
        del h

        def feature(i: int) -> torch.Tensor:
            f = kept[i]
            if f is None:
                f = x
                for ecd in encoder[: i + 1]:
                    f = ecd(f)
            return f

        g = self.generator
        w = g.style(z)
        styles = iter(g.layer_styles(w))
        out = g.input(w.shape[0]).to(x.dtype)
        top = len(encoder) - 1
        out = g.conv1(out, w, feature(top), style=next(styles))
        skip = g.to_rgb1(out, w, style=next(styles))
        for level, to_rgb in enumerate(g.to_rgbs):
            idx = top - 1 - level
            f = feature(idx)
            out = g.convs[2 * level](out, w, f, style=next(styles))
            out = g.convs[2 * level + 1](out, w, f, style=next(styles))
            del f
            kept[idx] = None                                          # last use: let the allocator reuse it
            skip = to_rgb(out, w, skip, style=next(styles))
        return skip
