"""The fused generator's CPU form: every conv one oneDNN call with its bias and leaky ReLU fused in (`--onednn`).

On a CPU at batch 1 the fused generator's PyTorch passes spend more time between the convolutions than in them
(benchmarks/RESULTS.md, "The generator on the CPU"): demodulation, bias, activation, gain and the next style are
separate elementwise passes over every activation. This form moves all of them into the convolutions:
* Demodulation stays pending: a conv outputs lrelu(y + b/d) (oneDNN's bias and leaky-ReLU post-op), and since
  lrelu(y*d + b) = d * lrelu(y + b/d) for d > 0, the factor d (and the sqrt(2) gain) travels with the activation
  as a per-channel vector that its consumers fold into their own scaling. No pass applies it.
* Modulation (the style, times the pending factors of the input) scales the conv's weights where they are smaller
  than its input (the high-resolution layers at batch 1: W is cin*cout*k*k values, the input cin*H*W), else the
  input: whichever pass is cheaper.
* The up-sampling conv (stride-2 transposed 3x3, then the 4x4 FIR) runs as ONE ordinary conv with 2x2 kernels and
  4*cout outputs, one per output phase (the same taps rearranged, no arithmetic), its phases interleaved by a copy,
  then the FIR as a depthwise conv that carries the bias and activation. oneDNN runs ordinary convs at its AMX
  rate; its transposed conv took up to 2x longer for the same outputs (RESULTS.md).
* The encoder-feature half of every conv input ("noise") is one depthwise 1x1 oneDNN conv (scale, bias, leaky
  ReLU), concatenated with the conv half; ToRGB is a 1x1 conv with the style folded into its weights.
Each call runs one sample at a time (the CPU's batch is 1; a larger batch loops). Built from the fused module in
the compute dtype (`fuse`), whose weight transforms, style path and ToRGB it shares.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.model.fused import FusedGenerator, _cl
from gpen_tune.model.gpen import FullGenerator
from gpen_tune.model.layers import EqualConv2d, FusedLeakyReLU

SQRT2 = math.sqrt(2.0)
SLOPE = 0.2


def available() -> str | None:
    """None where this form runs (PyTorch built with oneDNN and its fused-conv op), else why not."""
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch is built without oneDNN (mkldnn)"
    if not hasattr(torch.ops.mkldnn, "_convolution_pointwise"):
        return "this PyTorch has no oneDNN fused-convolution op (torch.ops.mkldnn._convolution_pointwise)"
    return None


def conv_act(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: int = 0, stride: int = 1,
             groups: int = 1, act: bool = True) -> torch.Tensor:
    """conv2d(x, weight) + bias, then leaky ReLU(0.2) when `act`: one oneDNN primitive, no separate passes."""
    attr, scalars = ("leaky_relu", [SLOPE]) if act else ("none", [])
    return torch.ops.mkldnn._convolution_pointwise(x, weight, bias, [padding, padding], [stride, stride], [1, 1],
                                                   groups, attr, scalars, None)


def phase_weight(wt: torch.Tensor) -> torch.Tensor:
    """A stride-2 transposed 3x3 conv weight [cin, cout, 3, 3] -> [4*cout, cin, 2, 2] of the same map as one conv.

    conv_transpose2d(x, wt, stride=2) == interleave(conv2d(x, phase_weight(wt), padding=1)) on its (2H+1)^2 output:
    output row 2n takes x[n] * w[0] + x[n-1] * w[2], row 2n+1 takes x[n] * w[1] (columns alike); output channel
    (py*2 + px)*cout + c is phase (py, px). Taps only move, so the weight keeps its dtype's values exactly."""
    cin, cout = wt.shape[:2]
    taps = ((2, 0), (None, 1))          # [phase][tap] -> transposed-conv tap (None: zero)
    out = wt.new_zeros(2, 2, cout, cin, 2, 2)
    for py in range(2):
        for px in range(2):
            for qy in range(2):
                for qx in range(2):
                    ky, kx = taps[py][qy], taps[px][qx]
                    if ky is not None and kx is not None:
                        out[py, px, :, :, qy, qx] = wt[:, :, ky, kx].t()
    return out.reshape(4 * cout, cin, 2, 2)


def interleave(y: torch.Tensor, cout: int) -> torch.Tensor:
    """[B, 4*cout, H, W] phases (`phase_weight`'s order) -> [B, cout, 2H, 2W] channels-last, one copy."""
    b, _, h, w = y.shape
    t = y.permute(0, 2, 3, 1).reshape(b, h, w, 2, 2, cout).permute(0, 1, 3, 2, 4, 5)
    return t.reshape(b, 2 * h, 2 * w, cout).permute(0, 3, 1, 2)


def pack(weight: torch.Tensor, padding: int, stride: int, groups: int, input_chw: tuple[int, int, int]
         ) -> torch.Tensor:
    """A constant conv weight in oneDNN's blocked layout for a batch-1 input of `input_chw`: without it every call
    reorders the weight (the decoder's 2x2 phase weights: 0.4 ms a call each)."""
    return torch.ops.mkldnn._reorder_convolution_weight(weight, [padding, padding], [stride, stride], [1, 1], groups,
                                                        [1, *input_chw])


class OnednnGenerator(FusedGenerator):
    """FullGenerator's forward in the oneDNN form above; forward: [B,3,S,S] in [-1,1] -> [B,3,S,S] fp32."""

    def __init__(self, model: FullGenerator, dtype: torch.dtype):
        super().__init__(model, dtype, impl="torch")
        size = self.size
        # encoder: the sqrt(2) gain folded into weight and bias (lrelu(g*z) = g*lrelu(z)); weights prepacked
        for layer, ecd in zip(self.encoder, model.encoder, strict=True):
            conv = next(m for m in ecd[0] if isinstance(m, EqualConv2d))
            act = next(m for m in ecd[0] if isinstance(m, FusedLeakyReLU))
            w = _cl((conv.weight.detach().float() * (conv.scale * SQRT2)).to(dtype))
            if layer.downsample:
                blur = _cl(self.enc_taps2d.to(dtype).expand(w.shape[1], 1, 4, 4))
                layer.packed_blur = pack(blur, 2, 1, w.shape[1], (w.shape[1], size, size))
                size = (size + 1) // 2
                layer.packed = pack(w, 0, 2, 1, (w.shape[1], size * 2 + 1, size * 2 + 1))
            else:
                layer.packed = pack(w, layer.padding, 1, 1, (w.shape[1], size, size))
            layer.register_buffer("bias_act", (act.bias.detach().float() * SQRT2).to(dtype), persistent=False)
            del layer.weight
        size = 4
        for layer in self.layers:
            self._decoder_layer(layer, size, dtype)
            size = size * 2 if layer.upsample else size

    def _decoder_layer(self, layer: nn.Module, size: int, dtype: torch.dtype) -> None:
        """Replace a styled layer's weight by what `_styled` runs (input `size` px): the up-conv's phase weight and
        its FIR as a depthwise weight; each constant weight prepacked, a modulated one (`modulate_weight`) kept
        to scale per call. The encoder-feature half's scale and bias as a depthwise 1x1 conv."""
        pad = layer.padding
        if layer.upsample:
            layer.weight = _cl(phase_weight(layer.weight))                 # [4*cout, cin, 2, 2]
            n, pad = 2 * size + 1, 1
            blur = _cl(layer.taps2d.to(dtype).expand(layer.cout, 1, 4, 4))
            layer.packed_blur = pack(blur, 1, 1, layer.cout, (layer.cout, n, n))
        cout, _, k, _ = layer.weight.shape
        # scale the weight per call where it is smaller than the input it would otherwise scale
        layer.modulate_weight = cout * k * k <= size * size
        layer.packed = None if layer.modulate_weight else pack(layer.weight, pad, 1, 1, (layer.cin, size, size))
        if layer.packed is not None:
            del layer.weight                                               # the packed copy is the only one
        out = 2 * size if layer.upsample else size
        noise = _cl(torch.full((layer.cout, 1, 1, 1), layer.nw, dtype=dtype))
        layer.packed_noise = pack(noise, 0, 1, layer.cout, (layer.cout, out, out))
        layer.register_buffer("noise_b", layer.b_f.to(dtype), persistent=False)

    def extra_repr(self) -> str:
        return f"size={self.size}, dtype={self.dtype}, oneDNN"

    def _encode_one(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = []
        h = x
        for layer in self.encoder:
            if layer.downsample:        # the FIR (pad 2) as a depthwise conv, then the stride-2 conv
                h = conv_act(h, layer.packed_blur, None, padding=2, groups=h.shape[1], act=False)
                h = conv_act(h, layer.packed, layer.bias_act, stride=2)
            else:
                h = conv_act(h, layer.packed, layer.bias_act, padding=layer.padding)
            feats.append(h)
        return feats

    def _styled(self, layer: nn.Module, buf: torch.Tensor, scale: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """lrelu(modconv(buf) / d + b / d): the conv with the style and the input's pending factors in `scale`
        applied to whichever of weight and input is smaller (`modulate_weight`)."""
        dt = self.dtype
        bias = (layer.b_h / d).to(dt)
        if layer.modulate_weight:
            weight = _cl(layer.weight * scale.to(dt).view(1, -1, 1, 1))
        else:
            weight = layer.packed
            buf = buf * scale.to(dt).view(1, -1, 1, 1)
        if not layer.upsample:
            return conv_act(buf, weight, bias, padding=layer.padding)
        y = interleave(conv_act(buf, weight, None, padding=1, act=False), layer.cout)  # the transposed conv
        n = 2 * buf.shape[-1]
        return conv_act(y, layer.packed_blur, bias, padding=1, groups=layer.cout)[:, :, :n, :n]

    def _rgb(self, k: int, buf: torch.Tensor, scale: torch.Tensor, skip: torch.Tensor | None) -> torch.Tensor:
        rgb = self.rgbs[k]
        weight = (rgb.weight * scale[:, None]).t().to(self.dtype)[:, :, None, None]   # [3, 2C, 1, 1]
        out = F.conv2d(buf, _cl(weight)).float() + rgb.bias
        if skip is not None:
            out = out + F.conv_transpose2d(skip, rgb.up_weight, stride=2, padding=1, groups=3)
        return out

    def _forward_one(self, x: torch.Tensor) -> torch.Tensor:
        dt = self.dtype
        feats = self._encode_one(x.to(dtype=dt, memory_format=torch.channels_last))
        styles = self._styles(feats[-1])[0]                                   # [sum of cin] fp32
        n_conv = len(self.layers)
        s_all = torch.split(styles, self.mod_sizes)
        buf = _cl(self.const.to(dt))
        pending = torch.ones(buf.shape[1])                   # per-channel factors the buffer's values still owe
        skip = None
        feat_idx = len(feats) - 1
        for k, layer in enumerate(self.layers):
            d = torch.rsqrt(torch.addmm(self.demod_eps, s_all[k][None].square(), layer.wsq))[0]
            h = self._styled(layer, buf, s_all[k] * pending, d)
            g = conv_act(feats[feat_idx], layer.packed_noise, layer.noise_b, groups=layer.cout)
            buf = torch.cat([h, g], dim=1)
            pending = torch.cat([d * SQRT2, torch.full_like(d, SQRT2)])
            if k == 0 or not layer.upsample:
                rgb_idx = 0 if k == 0 else (k - 1) // 2 + 1
                skip = self._rgb(rgb_idx, buf, s_all[n_conv + rgb_idx] * pending, skip)
                feats[feat_idx] = None                                       # last use: the allocator reuses it
                feat_idx -= 1
        return skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:
            return self._forward_one(x)
        return torch.cat([self._forward_one(x[i: i + 1]) for i in range(x.shape[0])])


def fuse_onednn(model: FullGenerator, dtype: torch.dtype | None = None) -> OnednnGenerator:
    """The oneDNN form of the fused generator from a loaded FullGenerator on the CPU (`fuse`'s contract)."""
    problem = available()
    if problem:
        raise RuntimeError(problem)
    dtype = dtype or model.compute_dtype
    with torch.no_grad():
        gen = OnednnGenerator(model, dtype).eval()
    gen.requires_grad_(False)
    return gen
