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
        self._vector_tables()

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

    def _vector_tables(self) -> None:
        """Index tables that give every layer's per-channel vectors (styles, demodulation, pending factors, biases)
        in a few whole-network ops per call instead of a dozen small ops per layer: rows padded to the widest."""
        layers, n = self.layers, len(self.layers)
        cin = [layer.cin for layer in layers]
        cout = [layer.cout for layer in layers]
        wide_in, wide_out = max(cin), max(cout)
        wsq = torch.zeros(n, wide_in, wide_out)
        b_h = torch.zeros(n, wide_out)
        for k, layer in enumerate(layers):
            wsq[k, : cin[k], : cout[k]] = layer.wsq
            b_h[k, : cout[k]] = layer.b_h
            del layer.wsq
        offsets = [sum(self.mod_sizes[:i]) for i in range(len(self.mod_sizes))]
        zero = sum(self.mod_sizes)                         # index of a 0 appended to the styles
        one, sqrt2 = n * wide_out, n * wide_out + 1        # indices of 1 and sqrt(2) appended to d * sqrt(2)
        # a layer's input: [conv half (pending d * sqrt2 of the layer before), noise half (pending sqrt2)]
        s_idx = torch.full((n, wide_in), zero)
        p_idx = torch.full((n, wide_in), one)
        for k in range(n):
            s_idx[k, : cin[k]] = torch.arange(offsets[k], offsets[k] + cin[k])
            if k > 0:
                c = cout[k - 1]
                p_idx[k, :c] = torch.arange((k - 1) * wide_out, (k - 1) * wide_out + c)
                p_idx[k, c: 2 * c] = sqrt2
        # ToRGB j reads the input of layer k_j + 1: after conv1 (j = 0), then after every level's second conv
        after = [0] + [k for k, layer in enumerate(layers) if k > 0 and not layer.upsample]
        wide_rgb = 2 * max(cout[k] for k in after)
        rs_idx = torch.full((len(after), wide_rgb), zero)
        rp_idx = torch.full((len(after), wide_rgb), one)
        for j, k in enumerate(after):
            c = cout[k]
            rs_idx[j, : 2 * c] = torch.arange(offsets[n + j], offsets[n + j] + 2 * c)
            rp_idx[j, :c] = torch.arange(k * wide_out, k * wide_out + c)
            rp_idx[j, c: 2 * c] = sqrt2
        for name, t in (("wsq_all", wsq), ("b_h_all", b_h), ("s_idx", s_idx), ("p_idx", p_idx),
                        ("rs_idx", rs_idx), ("rp_idx", rp_idx)):
            self.register_buffer(name, t, persistent=False)
        self.register_buffer("pend_consts", torch.tensor([1.0, SQRT2]), persistent=False)

    def _vectors(self, styles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """styles [sum of cin] -> (conv input scales [n, wide_in] in the compute dtype, conv biases b/d [n, wide_out]
        in the compute dtype, ToRGB scales [levels, wide_rgb] fp32): style times the input's pending factors."""
        s = torch.cat([styles, styles.new_zeros(1)])
        s_in = s[self.s_idx]
        d = torch.rsqrt(torch.bmm(s_in.square()[:, None], self.wsq_all)[:, 0] + 1e-8)    # [n, wide_out]
        pending = torch.cat([d.flatten() * SQRT2, self.pend_consts])
        scale = (s_in * pending[self.p_idx]).to(self.dtype)
        bias = (self.b_h_all / d).to(self.dtype)
        return scale, bias, s[self.rs_idx] * pending[self.rp_idx]

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

    def _styled(self, layer: nn.Module, buf: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """lrelu(modconv(buf) / d + b / d), `bias` = b / d: the conv with the style and the input's pending factors
        in `scale`, applied to whichever of weight and input is smaller (`modulate_weight`)."""
        if layer.modulate_weight:
            weight = _cl(layer.weight * scale.view(1, -1, 1, 1))
        else:
            weight = layer.packed
            buf = buf * scale.view(1, -1, 1, 1)
        if not layer.upsample:
            return conv_act(buf, weight, bias, padding=layer.padding)
        y = interleave(conv_act(buf, weight, None, padding=1, act=False), layer.cout)  # the transposed conv
        n = 2 * buf.shape[-1]
        return conv_act(y, layer.packed_blur, bias, padding=1, groups=layer.cout)[:, :, :n, :n]

    def _rgb(self, k: int, parts: list[torch.Tensor], scale: torch.Tensor, skip: torch.Tensor | None
             ) -> torch.Tensor:
        """ToRGB of the next input [conv half | noise half], given as one tensor or as its two halves: a 1x1 conv
        with the style in its weight and the bias, added to the up-sampled skip (fp32)."""
        rgb = self.rgbs[k]
        weight = _cl((rgb.weight * scale[: rgb.weight.shape[0], None]).t().to(self.dtype)[:, :, None, None])
        bias = rgb.bias.view(3).to(self.dtype)
        if len(parts) == 1:
            y = conv_act(parts[0], weight, bias, act=False)
        else:                   # the halves' two 1x1 convs, the second adding the first (no concatenated copy)
            c = parts[0].shape[1]
            y = torch.ops.mkldnn._convolution_pointwise(parts[1], conv_act(parts[0], weight[:, :c], bias, act=False),
                                                        weight[:, c:], None, [0, 0], [1, 1], [1, 1], 1, "add", 1.0,
                                                        None, [], None)
        if skip is None:
            return y.float()
        return F.conv_transpose2d(skip, rgb.up_weight, stride=2, padding=1, groups=3).add_(y)

    def _forward_one(self, x: torch.Tensor) -> torch.Tensor:
        feats = self._encode_one(x.to(dtype=self.dtype, memory_format=torch.channels_last))
        scale, bias, rgb_scale = self._vectors(self._styles(feats[-1])[0])
        buf = _cl(self.const.to(self.dtype))
        skip = None
        feat_idx = len(feats) - 1
        last = len(self.layers) - 1
        for k, layer in enumerate(self.layers):
            h = self._styled(layer, buf, scale[k, : layer.cin], bias[k, : layer.cout])
            g = conv_act(feats[feat_idx], layer.packed_noise, layer.noise_b, groups=layer.cout)
            parts = [h, g] if k == last else [torch.cat([h, g], dim=1)]       # the last one only feeds ToRGB
            buf = parts[0]
            if k == 0 or not layer.upsample:
                rgb_idx = 0 if k == 0 else (k - 1) // 2 + 1
                skip = self._rgb(rgb_idx, parts, rgb_scale[rgb_idx], skip)
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
