"""GPEN's building blocks, bottom-up as in the StyleGAN2 paper: equalised-LR layers, modulated convolution,
noise injection (GPEN concatenates encoder features instead of adding noise), styled conv and ToRGB.

Attribute names are a file format: they reproduce the official checkpoints' state-dict keys exactly
(`conv.modulation.weight`, `conv.blur.kernel`, `noise.weight`, `activate.bias`, ...).

Precision: every layer computes in the dtype of its input activations. The style path (EqualLinear) casts its
input to its own weight dtype, so a model whose conv weights were cast to bf16/fp16 while its linear layers stay
fp32 keeps the mapping network, the styles and the demodulation coefficients in fp32; ToRGB returns fp32 so the
image skip path accumulates in fp32 (the NVlabs StyleGAN2-ADA recipe).

Inference-shaped arithmetic (same function, fewer passes over the activations): the sqrt(2) gain of every
bias + leaky-ReLU is folded into the preceding weights and biases (lrelu(a*z) = a*lrelu(z) for a > 0); biases go
into the conv or an addcmul instead of a separate pass; at batch 1 the style and demodulation scale the (small)
weight instead of the (large) activations; the ReLU runs in place. Measured on an H200 (GPEN-512, batch 1, CUDA
graph replay): fp32 7.17 -> 5.70 ms, bf16 5.99 -> 4.83 ms (benchmarks/results/plain_bs1_20261130T195054Z_*.json).
Then at batch 1 the styled conv's last pass writes leaky_relu(conv) straight into its half of the concatenation
buffer (`act_out`), the generator computes all layer styles in one GEMM (`Generator.layer_styles`), and the
weight-derived caches are read inside graph captures (`cached_per_weights`): fp32 4.95 -> 4.34 ms, bf16 4.17 ->
3.47 ms (plain_bs1_20261201T024309Z).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.ops.fir import leaky_relu_into, make_kernel, upfirdn2d

SQRT2 = math.sqrt(2.0)
LRELU_SLOPE = 0.2

# ---------------------------------------------------------------------------------------------------------------


class PixelNorm(nn.Module):
    """x / rms(x) over channels; the first layer of the mapping network."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(torch.mean(x * x, dim=1, keepdim=True) + 1e-8)


class Blur(nn.Module):
    """Depthwise 4x4 FIR with zero padding; `kernel` is a persistent buffer (it is in the checkpoints).

    `unit(x, bias)` applies the FIR divided by `gain` (4 after a 2x up-sampling conv, 1 elsewhere) and adds a
    per-channel bias in the same kernel, so an up-sampling conv can fold the gain into its weight and its bias into
    the blur instead of spending a full-size pass on each.
    """

    def __init__(self, kernel: tuple[int, ...], pad: tuple[int, int], upsample_factor: int = 1):
        super().__init__()
        k = make_kernel(kernel)
        self.gain = float(upsample_factor**2)
        if upsample_factor > 1:
            k = k * self.gain
        self.register_buffer("kernel", k)
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, pad=self.pad)

    def unit(self, x: torch.Tensor, bias: torch.Tensor | None = None, act_out: torch.Tensor | None = None
             ) -> torch.Tensor:
        """FIR / gain + bias; with `act_out`, leaky_relu of it is written there (same pass on the Triton path)."""
        k = self.kernel if self.gain == 1.0 else self.kernel / self.gain
        slope = None if act_out is None else LRELU_SLOPE
        return upfirdn2d(x, k, pad=self.pad, bias=bias, out=act_out, negative_slope=slope)


class Upsample(nn.Module):
    """2x FIR upsampling of the RGB skip: zero insertion, pad (2, 1), 4x4 FIR times 4."""

    def __init__(self, kernel: tuple[int, ...], factor: int = 2):
        super().__init__()
        self.factor = factor
        self.register_buffer("kernel", make_kernel(kernel) * factor**2)
        p = len(kernel) - factor
        self.pad = ((p + 1) // 2 + factor - 1, p // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, up=self.factor, pad=self.pad)


# ---------------------------------------------------------------------------------------------------------------


def standard_normal(*shape: int, divisor: float = 1.0) -> torch.Tensor:
    """A weight's initial value, `torch.randn(*shape) / divisor`; on the meta device an empty tensor, since `randn`
    and `div_` there run Python decompositions whose first use imports SymPy (0.3-1 s of every command's start-up:
    `load_model` builds the module on meta, then assigns the file's tensors)."""
    t = torch.empty(shape)
    if t.is_meta:
        return t
    t.normal_()
    return t.div_(divisor) if divisor != 1.0 else t


class EqualConv2d(nn.Module):
    """Conv with the He constant applied at run time (equalised learning rate)."""

    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(standard_normal(out_channel, in_channel, kernel_size, kernel_size))
        self.scale = 1 / math.sqrt(in_channel * kernel_size**2)
        self.stride = stride
        self.padding = padding
        self.bias = nn.Parameter(torch.zeros(out_channel)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.conv2d(x, self.weight.to(x.dtype) * self.scale, bias, stride=self.stride, padding=self.padding)

    def __repr__(self) -> str:
        o, i, k, _ = self.weight.shape
        return f"{type(self).__name__}({i}, {o}, {k}, stride={self.stride}, padding={self.padding})"


class EqualLinear(nn.Module):
    """Linear layer with equalised LR; with `activation` it is sqrt(2)*lrelu(xW^T + b), the bias fused."""

    def __init__(self, in_dim: int, out_dim: int, bias: bool = True, bias_init: float = 0.0, lr_mul: float = 1.0,
                 activation: str | None = None):
        super().__init__()
        self.weight = nn.Parameter(standard_normal(out_dim, in_dim, divisor=lr_mul))
        self.bias = nn.Parameter(torch.full((out_dim,), float(bias_init))) if bias else None
        self.activation = activation
        self.scale = (1 / math.sqrt(in_dim)) * lr_mul
        self.lr_mul = lr_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.weight.dtype)  # the style path runs in the linear layers' dtype (fp32 under --amp)
        if x.dim() != 2:  # GPEN only feeds [B, C]; other shapes go through the same GEMM
            return self(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
        gain = SQRT2 if self.activation else 1.0
        if self.bias is None:
            out = F.linear(x, self.weight) * (self.scale * gain)
        else:  # one GEMM: gain * (x (scale W)^T + lr_mul b), scales applied in the epilogue
            out = torch.addmm(self.bias, x, self.weight.t(), beta=self.lr_mul * gain, alpha=self.scale * gain)
        return F.leaky_relu(out, LRELU_SLOPE, inplace=True) if self.activation else out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.weight.shape[1]}, {self.weight.shape[0]})"


class FusedLeakyReLU(nn.Module):
    """Holds the checkpoint's `activate.bias` of a per-channel bias + sqrt(2)-scaled leaky ReLU; the owning layer
    (StyledConv, ConvLayer) applies it, folded into its conv and in-place ReLU."""

    def __init__(self, channel: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channel))


# ---------------------------------------------------------------------------------------------------------------


class ModulatedConv2d(nn.Module):
    """StyleGAN2's modulated convolution in its batch-friendly form.

    Upstream builds one weight per sample, W'[b,o,i] = scale * W[o,i] * s[b,i], demodulates it and runs a grouped
    conv with groups = batch. Here the style scales the activations, one conv with the shared weight runs for the
    whole batch, and the demodulation coefficient d[b,o] = rsqrt(sum_i s[b,i]^2 * sum_k (scale*W[o,i,k])^2 + 1e-8)
    scales the result: the same function (conv is linear in the input channels), no grouped conv, any batch size.
    The up-sampling variant is a stride-2 transposed conv followed by the 4x4 FIR (`blur`), as upstream.
    """

    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, style_dim: int, demodulate: bool = True,
                 upsample: bool = False, blur_kernel: tuple[int, ...] = (1, 3, 3, 1)):
        super().__init__()
        self.in_channel = in_channel
        self.out_channel = out_channel
        self.kernel_size = kernel_size
        self.upsample = upsample
        self.demodulate = demodulate
        self.scale = 1 / math.sqrt(in_channel * kernel_size**2)
        self.padding = kernel_size // 2
        # registration order (weight, blur, modulation) reproduces the official state-dict order
        self.weight = nn.Parameter(standard_normal(1, out_channel, in_channel, kernel_size, kernel_size))
        if upsample:
            factor = 2
            p = (len(blur_kernel) - factor) - (kernel_size - 1)
            self.blur = Blur(blur_kernel, pad=((p + 1) // 2 + factor - 1, p // 2 + 1), upsample_factor=factor)
        self.modulation = EqualLinear(style_dim, in_channel, bias_init=1)
        self.weight_gain = self.scale * (self.blur.gain if upsample else 1.0)   # blur's gain folded in
        self._wsq: tuple[tuple, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                gain: float = 1.0, style: torch.Tensor | None = None,
                act_out: torch.Tensor | None = None) -> torch.Tensor:
        """gain * demod(conv(style * x)) + bias; `bias` [cout] in x's dtype (the caller's, already scaled).

        `style`: this layer's A(w) if the caller computed it already (Generator.layer_styles: one GEMM for all
        layers). `act_out` (batch 1 only): a contiguous [1, cout, H, W] buffer that receives leaky_relu(result),
        written by the conv's last pass instead of a copy plus an activation pass (StyledConv's concat half)."""
        style = self.modulation(w) if style is None else style        # [B, cin], fp32 style path
        d = self.demod_coefficients(style) if self.demodulate else None  # [B, cout], fp32
        if x.shape[0] == 1:
            return self._forward_single(x, style, d, bias, gain, act_out)
        if act_out is not None:
            raise ValueError("act_out is for batch 1 only")
        x = x * style.to(x.dtype)[:, :, None, None]
        weight = self.weight[0].to(x.dtype) * self.weight_gain        # [cout, cin, k, k], shared by the batch
        y = self._conv(x, weight, None)
        if d is None:
            y = y * gain if gain != 1.0 else y
            return y if bias is None else y + bias[None, :, None, None]
        scale = (d * gain if gain != 1.0 else d).to(y.dtype)[:, :, None, None]
        return y * scale if bias is None else torch.addcmul(bias[None, :, None, None], y, scale)

    def _forward_single(self, x: torch.Tensor, style: torch.Tensor, d: torch.Tensor | None,
                        bias: torch.Tensor | None, gain: float, act_out: torch.Tensor | None = None) -> torch.Tensor:
        """Batch 1: style, demodulation and gain scale the weight (cout*cin*k*k values), not the activations."""
        s = style[0] * (self.weight_gain * gain)                      # [cin] fp32
        coef = s[None, :] if d is None else d[0, :, None] * s[None, :]  # [cout or 1, cin]
        w = self.weight[0]
        weight = (w * coef.to(w.dtype)[:, :, None, None]).to(x.dtype)
        return self._conv(x, weight, bias, act_out)

    def _conv(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              act_out: torch.Tensor | None = None) -> torch.Tensor:
        if self.upsample:
            x = F.conv_transpose2d(x, weight.transpose(0, 1), stride=2)  # H -> 2H+1
            return self.blur.unit(x, bias, act_out)                       # 2H+1 -> 2H (gain is in the weight)
        y = F.conv2d(x, weight, bias, padding=self.padding)
        return y if act_out is None else leaky_relu_into(y, act_out, LRELU_SLOPE)

    def demod_coefficients(self, style: torch.Tensor) -> torch.Tensor:
        """d[b, o] in fp32: the sum of squares over cin*k*k terms overflows fp16, so it never runs in half."""
        wsq = self.weight_square_sums()                                        # [cout, cin], unscaled
        return (style.float().square() @ wsq.t()).mul_(self.scale**2).add_(1e-8).rsqrt_()  # [B, cout]

    def weight_square_sums(self) -> torch.Tensor:
        """sum_k W[o,i,k]^2 in fp32. Style-independent, so it is cached while the weight stays the same tensor with
        the same version (see `cached_per_weights`)."""
        w = self.weight
        self._wsq, value = cached_per_weights(self._wsq, (w,), lambda: w[0].float().square().sum(dim=(2, 3)))
        return value

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channel}, {self.out_channel}, {self.kernel_size}, "
                f"upsample={self.upsample}, demodulate={self.demodulate})")


def cached_per_weights(cache: tuple | None, tensors: tuple[torch.Tensor, ...], compute: Callable[[], Any]
                       ) -> tuple[tuple | None, Any]:
    """(new cache, value) for a value derived from weights only (demodulation sums, the stacked style weights).

    The cache is valid while every tensor is the same tensor with the same version. It is read even inside a
    CUDA-graph capture (a graph captured after a warm-up call reads the cached tensor instead of recomputing it on
    every replay; change weights before capturing, as usual) but never written there (the new tensor would live in
    the graph's private pool). Not used while training the weights, while torch.compile traces, or for inference
    tensors (they have no version)."""
    if torch.compiler.is_compiling() or any((torch.is_grad_enabled() and t.requires_grad) or t.is_inference()
                                            for t in tensors):
        return cache, compute()
    key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
    if cache is not None and cache[0] == key:
        return cache, cache[1]
    if tensors[0].is_cuda and torch.cuda.is_current_stream_capturing():
        return cache, compute()
    with torch.inference_mode(False), torch.no_grad():
        value = compute()
    return (key, value), value


class NoiseInjection(nn.Module):
    """Holds GPEN's 'noise' scalar (`noise.weight`): the encoder feature of the same resolution is scaled by it and
    concatenated after the modulated conv; StyledConv applies it (inside its output buffer)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))


class ConstantInput(nn.Module):
    """Learned 4x4 start of the synthesis network, repeated over the batch."""

    def __init__(self, channel: int, size: int = 4):
        super().__init__()
        self.input = nn.Parameter(standard_normal(1, channel, size, size))

    def forward(self, batch: int) -> torch.Tensor:
        return self.input.expand(batch, -1, -1, -1)


class StyledConv(nn.Module):
    """ModulatedConv2d -> concat encoder feature -> bias + lrelu over both halves (2*cout channels)."""

    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, style_dim: int, upsample: bool = False,
                 blur_kernel: tuple[int, ...] = (1, 3, 3, 1)):
        super().__init__()
        self.conv = ModulatedConv2d(in_channel, out_channel, kernel_size, style_dim, upsample=upsample,
                                    blur_kernel=blur_kernel)
        self.noise = NoiseInjection()
        self.activate = FusedLeakyReLU(out_channel * 2)
        # set by --checkpoint (gpen_tune.tune.act_checkpoint): scale the feature inside the concatenation buffer
        # (one C-channel temporary less at the peak, one more pass over it)
        self.low_memory = False

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise: torch.Tensor,
                style: torch.Tensor | None = None) -> torch.Tensor:
        """lrelu(cat(conv, noise_w * feature) + b) * sqrt2, with the gain folded in before the (in-place) ReLU."""
        c = self.conv.out_channel
        bias = (self.activate.bias * SQRT2).to(x.dtype)              # [2 cout]
        if x.shape[0] == 1 and not self.low_memory:
            # batch 1: each half of the output is a contiguous block: the conv's last pass writes lrelu(conv) into
            # the first, the scaled feature is written into the second and activated there
            out = torch.empty((1, 2 * c, *noise.shape[2:]), dtype=x.dtype, device=x.device)
            self.conv(x, w, bias=bias[:c], gain=SQRT2, style=style, act_out=out[:, :c])
            half = out[:, c:]
            torch.addcmul(bias[None, c:, None, None], noise.to(x.dtype), self.noise.weight.to(x.dtype) * SQRT2,
                          out=half)
            F.leaky_relu(half, LRELU_SLOPE, inplace=True)
            return out
        y = self.conv(x, w, bias=bias[:c], gain=SQRT2, style=style)
        dtype = y.dtype
        noise_gain = self.noise.weight.to(dtype) * SQRT2
        if self.low_memory:
            out = torch.cat([y, noise.to(dtype)], dim=1)
            del y
            out[:, c:].mul_(noise_gain).add_(bias[None, c:, None, None])
        else:
            out = torch.cat([y, torch.addcmul(bias[None, c:, None, None], noise.to(dtype), noise_gain)], dim=1)
        return F.leaky_relu(out, LRELU_SLOPE, inplace=True)


class ToRGB(nn.Module):
    """1x1 modulated conv to RGB (no demodulation) plus the upsampled skip; returns fp32."""

    def __init__(self, in_channel: int, style_dim: int, upsample: bool = True,
                 blur_kernel: tuple[int, ...] = (1, 3, 3, 1)):
        super().__init__()
        # `bias` is registered before the children so the state-dict order matches the official files
        self.bias = nn.Parameter(torch.zeros(1, 3, 1, 1))
        if upsample:
            self.upsample = Upsample(blur_kernel)
        self.conv = ModulatedConv2d(in_channel, 3, 1, style_dim, demodulate=False)

    def forward(self, x: torch.Tensor, w: torch.Tensor, skip: torch.Tensor | None = None,
                style: torch.Tensor | None = None) -> torch.Tensor:
        out = self.conv(x, w, style=style).float() + self.bias.float()
        if skip is not None:
            out = out + self.upsample(skip)
        return out


class ConvLayer(nn.Sequential):
    """Encoder layer: [Blur] -> EqualConv2d (no bias) -> FusedLeakyReLU; a Sequential, hence the `.0.1.` keys."""

    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, downsample: bool = False,
                 blur_kernel: tuple[int, ...] = (1, 3, 3, 1)):
        layers: list[nn.Module] = []
        if downsample:
            p = (len(blur_kernel) - 2) + (kernel_size - 1)
            layers.append(Blur(blur_kernel, pad=((p + 1) // 2, p // 2)))
            layers.append(EqualConv2d(in_channel, out_channel, kernel_size, stride=2, padding=0, bias=False))
        else:
            layers.append(EqualConv2d(in_channel, out_channel, kernel_size, stride=1, padding=kernel_size // 2,
                                      bias=False))
        layers.append(FusedLeakyReLU(out_channel))
        super().__init__(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[Blur] -> conv with the bias and the sqrt(2) gain folded in -> in-place leaky ReLU."""
        *pre, conv, act = self
        for m in pre:
            x = m(x)
        weight = conv.weight.to(x.dtype) * (conv.scale * SQRT2)
        y = F.conv2d(x, weight, (act.bias * SQRT2).to(x.dtype), stride=conv.stride, padding=conv.padding)
        return F.leaky_relu(y, LRELU_SLOPE, inplace=True)
