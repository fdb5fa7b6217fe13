"""GPEN's building blocks, bottom-up as in the StyleGAN2 paper: equalised-LR layers, modulated convolution,
noise injection (GPEN concatenates encoder features instead of adding noise), styled conv and ToRGB.

Attribute names are a file format: they reproduce the official checkpoints' state-dict keys exactly
(`conv.modulation.weight`, `conv.blur.kernel`, `noise.weight`, `activate.bias`, ...).

Precision: every layer computes in the dtype of its input activations. The style path (EqualLinear) casts its
input to its own weight dtype, so a model whose conv weights were cast to bf16/fp16 while its linear layers stay
fp32 keeps the mapping network, the styles and the demodulation coefficients in fp32; ToRGB returns fp32 so the
image skip path accumulates in fp32 (the NVlabs StyleGAN2-ADA recipe).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpen_tune.ops.fir import fused_leaky_relu, make_kernel, upfirdn2d

# ---------------------------------------------------------------------------------------------------------------


class PixelNorm(nn.Module):
    """x / rms(x) over channels; the first layer of the mapping network."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(torch.mean(x * x, dim=1, keepdim=True) + 1e-8)


class Blur(nn.Module):
    """Depthwise 4x4 FIR with zero padding; `kernel` is a persistent buffer (it is in the checkpoints)."""

    def __init__(self, kernel: tuple[int, ...], pad: tuple[int, int], upsample_factor: int = 1):
        super().__init__()
        k = make_kernel(kernel)
        if upsample_factor > 1:
            k = k * upsample_factor**2
        self.register_buffer("kernel", k)
        self.pad = pad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upfirdn2d(x, self.kernel, pad=self.pad)


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


class EqualConv2d(nn.Module):
    """Conv with the He constant applied at run time (equalised learning rate)."""

    def __init__(self, in_channel: int, out_channel: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channel, in_channel, kernel_size, kernel_size))
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
        self.weight = nn.Parameter(torch.randn(out_dim, in_dim) / lr_mul)
        self.bias = nn.Parameter(torch.full((out_dim,), float(bias_init))) if bias else None
        self.activation = activation
        self.scale = (1 / math.sqrt(in_dim)) * lr_mul
        self.lr_mul = lr_mul

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.weight.dtype)  # the style path runs in the linear layers' dtype (fp32 under --amp)
        if self.activation:
            return fused_leaky_relu(F.linear(x, self.weight * self.scale), self.bias * self.lr_mul)
        bias = None if self.bias is None else self.bias * self.lr_mul
        return F.linear(x, self.weight * self.scale, bias)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.weight.shape[1]}, {self.weight.shape[0]})"


class FusedLeakyReLU(nn.Module):
    """Per-channel bias + sqrt(2)-scaled leaky ReLU; the bias is the checkpoint's `activate.bias`."""

    def __init__(self, channel: int):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(channel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_leaky_relu(x, self.bias)


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
        self.weight = nn.Parameter(torch.randn(1, out_channel, in_channel, kernel_size, kernel_size))
        if upsample:
            factor = 2
            p = (len(blur_kernel) - factor) - (kernel_size - 1)
            self.blur = Blur(blur_kernel, pad=((p + 1) // 2 + factor - 1, p // 2 + 1), upsample_factor=factor)
        self.modulation = EqualLinear(style_dim, in_channel, bias_init=1)

    def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        style = self.modulation(w)                                    # [B, cin], fp32 style path
        weight = self.weight[0].to(x.dtype) * self.scale              # [cout, cin, k, k], shared by the batch
        x = x * style.to(x.dtype)[:, :, None, None]
        if self.upsample:
            x = F.conv_transpose2d(x, weight.transpose(0, 1), stride=2)  # H -> 2H+1
            x = self.blur(x)                                              # 2H+1 -> 2H
        else:
            x = F.conv2d(x, weight, padding=self.padding)
        if self.demodulate:
            x = x * self.demod_coefficients(style)[:, :, None, None].to(x.dtype)
        return x

    def demod_coefficients(self, style: torch.Tensor) -> torch.Tensor:
        """d[b, o] in fp32: the sum of squares over cin*k*k terms overflows fp16, so it never runs in half."""
        wsq = (self.weight[0].float() * self.scale).square().sum(dim=(2, 3))  # [cout, cin]
        return torch.rsqrt(style.float().square() @ wsq.t() + 1e-8)             # [B, cout]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.in_channel}, {self.out_channel}, {self.kernel_size}, "
                f"upsample={self.upsample}, demodulate={self.demodulate})")


class NoiseInjection(nn.Module):
    """GPEN's 'noise': the encoder feature of the same resolution, scaled by a learned scalar and concatenated."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))

    def forward(self, image: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return torch.cat([image, noise.to(image.dtype) * self.weight.to(image.dtype)], dim=1)


class ConstantInput(nn.Module):
    """Learned 4x4 start of the synthesis network, repeated over the batch."""

    def __init__(self, channel: int, size: int = 4):
        super().__init__()
        self.input = nn.Parameter(torch.randn(1, channel, size, size))

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

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.activate(self.noise(self.conv(x, w), noise))


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

    def forward(self, x: torch.Tensor, w: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        out = self.conv(x, w).float() + self.bias.float()
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
