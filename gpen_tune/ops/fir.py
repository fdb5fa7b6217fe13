"""FIR resampling (upfirdn2d) and fused bias + leaky ReLU in plain PyTorch.

No compiled extension: these are the formulas of StyleGAN2's ops written as ordinary tensor code, so the model
runs on any device, casts to any dtype and traces under torch.compile / CUDA Graphs without graph breaks. On CUDA
the 4x4 FIR may instead run as one Triton kernel (fir_triton.py: inside graph captures and for big tensors).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpen_tune.ops import fir_triton


def make_kernel(k: tuple[int, ...] | list[int]) -> torch.Tensor:
    """Outer product of a 1-D FIR with itself, normalised to sum 1 (StyleGAN2's `make_kernel`).

    Always made on the CPU (a few floats): inside a `torch.device("meta")` model build, arithmetic on meta tensors
    runs PyTorch's Python reference kernels, which import torch._dynamo (~170 MB resident) on first use."""
    k1 = torch.tensor(k, dtype=torch.float32, device="cpu")
    k2 = k1[None, :] * k1[:, None]
    return k2 / k2.sum()


def upfirdn2d(
    x: torch.Tensor, kernel: torch.Tensor, up: int = 1, down: int = 1, pad: tuple[int, int] = (0, 0),
    bias: torch.Tensor | None = None, out: torch.Tensor | None = None, negative_slope: float | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Upsample by zero insertion, pad, convolve with `kernel` (depthwise, true convolution), downsample.

    Args:
        x: [N, C, H, W].
        kernel: [kh, kw] FIR, applied to every channel.
        up, down: integer factors, identical on both axes.
        pad: (before, after) zero padding, identical on both axes.
        bias: optional [C] per-channel bias added by the same conv (before `down`).
        out, negative_slope: with both (up = down = 1 only), leaky_relu(result, negative_slope) is written into
            `out` (contiguous, the result's shape) and `out` is returned: the Triton kernel does it in the same
            pass, the conv path in one more.
        impl: "auto" (the Triton kernel where it pays, see fir_triton.py), "torch" (always the conv path),
            "triton" (the kernel wherever it can run: A/B measurements).
    Returns:
        [N, C, (H*up + p0 + p1 - kh)//down + 1, ...].
    """
    n, c, h, w = x.shape
    if up > 1:
        x = x.reshape(n, c, h, 1, w, 1)
        x = F.pad(x, [0, up - 1, 0, 0, 0, up - 1])
        x = x.reshape(n, c, h * up, w * up)
    p0, p1 = pad
    if (out is None) != (negative_slope is None) or (out is not None and (up, down) != (1, 1)):
        raise ValueError("out and negative_slope go together, and only with up = down = 1")
    if p0 >= 0 and p1 >= 0 and fir_triton.applies(x, kernel, impl):   # CUDA: one Triton pass (see fir_triton.py)
        try:
            y = fir_triton.fir4(x, kernel, (p0, p1), bias, out=out, negative_slope=negative_slope)
            return y[:, :, ::down, ::down] if down > 1 else y
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - a Triton compile/launch failure must not break the model
            fir_triton.disable(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}")
    same = p0 == p1 and p0 >= 0                 # symmetric: let the conv pad (no padded copy of x)
    if not same and (p0 or p1):
        x = F.pad(x, [p0, p1, p0, p1])
    weight = kernel.flip(0, 1).to(dtype=x.dtype).expand(c, 1, *kernel.shape)
    x = F.conv2d(x, weight, bias, groups=c, padding=p0 if same else 0)   # bias: [C], added before `down`
    if down > 1:
        x = x[:, :, ::down, ::down]
    if out is not None:
        return leaky_relu_into(x, out, negative_slope)
    return x


def leaky_relu_into(x: torch.Tensor, out: torch.Tensor, negative_slope: float) -> torch.Tensor:
    """out = leaky_relu(x) in one pass (read x, write out) instead of a copy and an in-place activation."""
    if torch.compiler.is_compiling():           # Inductor fuses the copy into the activation itself
        return out.copy_(F.leaky_relu(x, negative_slope))
    return torch._C._nn.leaky_relu(x, negative_slope, out=out)


def fused_leaky_relu(x: torch.Tensor, bias: torch.Tensor, negative_slope: float = 0.2) -> torch.Tensor:
    """sqrt(2) * leaky_relu(x + bias): the bias broadcast over dim 1, gain keeps the activation variance."""
    shape = [1, -1] + [1] * (x.dim() - 2)
    return F.leaky_relu(x + bias.to(x.dtype).view(shape), negative_slope) * math.sqrt(2.0)
