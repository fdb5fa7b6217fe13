"""The fused elementwise passes of the fused generator (gpen_tune.model.fused), in plain PyTorch: the CPU path
and the twin of the Triton kernels in `gpen_tune.ops.modconv_epilogue_triton` (same signatures, tested against).

Each function computes in one expression what the plain model does in several passes. Shapes are NCHW
logically; the memory format of the inputs is kept.

Styled-conv epilogue (decoder), for a conv output y with C channels and the encoder feature f (C channels):
    out[:, :C] = lrelu(blur(y) * d + b_h) * sqrt2 * s_h      (d: demodulation [B, C], s_h: next layer's style)
    out[:, C:] = lrelu(f * nw + b_f) * sqrt2 * s_f           (the 'noise' half: concatenated encoder feature)
i.e. demodulation + concat + bias + leaky ReLU + gain + the *next* conv's input modulation in one pass, writing
the next conv's input directly (no concatenated copy, no separately scaled copy).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SQRT2 = math.sqrt(2.0)
NEG_SLOPE = 0.2
# |style| floor for the scale written into the buffer; see `safe_style`
STYLE_FLOOR = 1e-20


def safe_style(s: torch.Tensor, rel: float = 0.0) -> torch.Tensor:
    """s with |s| >= max(1e-20, rel * max_c |s[b, c]|) per row (sign kept, 0 -> +floor).

    The buffer holds act * s_next and ToRGB divides by s_next to undo it; the floor keeps that division finite and,
    in fp16 (rel = 2**-10), keeps act * s_next above fp16's underflow so ToRGB still sees the channel. Raising a
    |s| below the floor changes the next conv's input by < floor * |act|: 1e-20 is far below any rounding; the
    fp16 floor is at fp16's own relative precision against the row's largest style.
    """
    floor = torch.full_like(s[:, :1], STYLE_FLOOR)
    if rel > 0:
        floor = torch.maximum(floor, s.abs().amax(dim=1, keepdim=True) * rel)
    return torch.where(s >= 0, torch.maximum(s, floor), torch.minimum(s, -floor))


def separable_taps(kernel: torch.Tensor) -> tuple[list[float], list[float]]:
    """1-D taps (rows, cols) of a rank-1 4x4 FIR, flipped for correlation (upfirdn2d is a true convolution)."""
    k = kernel.detach().double().cpu().flip(0, 1)
    rows = k.sum(1)
    cols = k.sum(0) / k.sum()
    if not torch.allclose(rows[:, None] * cols[None, :], k, rtol=1e-6, atol=1e-9):
        raise NotImplementedError("fast path needs a separable FIR kernel (GPEN's [1,3,3,1] is)")
    return [float(v) for v in rows], [float(v) for v in cols]


def blur(x: torch.Tensor, taps: tuple[list[float], list[float]] | torch.Tensor, pad: int) -> torch.Tensor:
    """Depthwise 4x4 FIR with `pad` zeros on every side: H -> H + 2*pad - 3, one grouped convolution.

    taps: the (rows, cols) 1-D taps of `separable_taps` or their [4, 4] outer product (a module buffer: nothing is
    built from Python data, so it is capture-safe). A grouped conv, not 8 shifted slices: on the CPU in bf16 the
    slices cost 14 elementwise passes, 6.5x the CPU time of oneDNN's depthwise conv, and round after every pass
    (the conv accumulates in fp32)."""
    if not isinstance(taps, torch.Tensor):
        rows, cols = taps
        taps = torch.tensor(rows, dtype=torch.float32)[:, None] * torch.tensor(cols, dtype=torch.float32)[None, :]
    c = x.shape[1]
    weight = taps.to(device=x.device, dtype=x.dtype).expand(c, 1, 4, 4).contiguous()
    return F.conv2d(F.pad(x, [pad, pad, pad, pad]), weight, groups=c)


def lrelu_gain(x: torch.Tensor) -> torch.Tensor:
    """sqrt(2) * leaky_relu(x, 0.2)."""
    return F.leaky_relu(x, NEG_SLOPE) * SQRT2


def _bc(v: torch.Tensor) -> torch.Tensor:
    """[C] -> [1, C, 1, 1]; [B, C] -> [B, C, 1, 1]."""
    return v.view(1, -1, 1, 1) if v.dim() == 1 else v[:, :, None, None]


def styled_epilogue(y: torch.Tensor, f: torch.Tensor, d: torch.Tensor, b_h: torch.Tensor, s_h: torch.Tensor,
                    b_f: torch.Tensor, s_f: torch.Tensor, nw: float,
                    taps: tuple[list[float], list[float]] | torch.Tensor | None = None) -> torch.Tensor:
    """The decoder's fused pass (module docstring). taps given: y is the transposed-conv output (2H+1), blurred
    with pad 1 to 2H first. Vectors are fp32; the result has y's dtype and memory format."""
    dt = y.dtype
    if taps is not None:
        y = blur(y, taps, pad=1)
    # both halves written straight into the result (no per-half tensors and no concatenation: at 512 px that
    # was 256 MB of a CPU face's 450 MB activation peak); the same elementwise steps, so the same values
    fmt = torch.channels_last if y.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    b, c, hgt, wid = y.shape
    out = torch.empty((b, c + f.shape[1], hgt, wid), dtype=dt, device=y.device, memory_format=fmt)
    h, g = out[:, :c], out[:, c:]
    # three passes per half: (y * d + b), leaky ReLU in place, one scale (gain and next style folded into it)
    F.leaky_relu_(torch.addcmul(_bc(b_h).to(dt), y, _bc(d).to(dt), out=h), NEG_SLOPE).mul_(_bc(s_h * SQRT2).to(dt))
    F.leaky_relu_(torch.add(_bc(b_f).to(dt), f.to(dt), alpha=nw, out=g), NEG_SLOPE).mul_(_bc(s_f * SQRT2).to(dt))
    return out


def encoder_epilogue(z: torch.Tensor, bias: torch.Tensor,
                     taps: tuple[list[float], list[float]] | torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """f = sqrt2 * lrelu(z + bias) (the encoder feature) and, with taps, the next layer's input blur(f, pad 2)."""
    f = F.leaky_relu_(z + _bc(bias).to(z.dtype), NEG_SLOPE).mul_(SQRT2)
    fb = blur(f, taps, pad=2) if taps is not None else None
    return f, fb
