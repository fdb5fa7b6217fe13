"""The 4x4 FIR (StyleGAN2's blur) as one Triton kernel for NCHW tensors on CUDA, bias included.

Why: PyTorch runs a depthwise 4x4 conv with its generic depthwise kernel, measured at 25 % (fp32) and 30 % (bf16)
of GPEN-512's batch-1 GPU time on an H200 (plain_bs1_20261130T195054Z), several times the memory floor. This
kernel reads each input plane tile once from DRAM (the 16 shifted loads hit L1), accumulates in fp32 and writes
the output once, with the per-channel bias added in the same pass.
Used by `gpen_tune.ops.fir.upfirdn2d` for up = down = 1 on CUDA tensors (not while torch.compile traces: Dynamo
would break the graph at the launch; Inductor fuses the conv path itself).
When: a Triton launch costs more host time than PyTorch's conv (measured on the H200: eager bs1 went from 7.9 to
10.2 ms with every FIR on Triton while its GPU time fell 0.7 ms), and an eager bs1 forward is host-bound. So
`impl="auto"` takes Triton inside `for_graph_capture()` (the graph wrapper's warm-up and capture: replays pay
no launch cost, and every kernel variant compiles before capture starts) and, in eager mode, only for tensors of
at least EAGER_MIN_ELEMENTS, where the GPU time saved exceeds the launch cost. `impl="triton"` / `"torch"` (an
argument of `upfirdn2d`) force one side: the benchmark's A/B and the tests' reference. CPU tests run the kernel
through Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import contextlib
import threading
import warnings

import torch

from gpen_tune.ops.triton_support import INTERPRET as _INTERPRET  # without Triton the conv path is used
from gpen_tune.ops.triton_support import tl, triton

IMPLS = ("auto", "torch", "triton")
EAGER_MIN_ELEMENTS = 1 << 22          # 4M: GPEN-512 bs1's two largest planes (512^2 x 32, 256^2 x 64) and up
_TILE_Y, _TILE_X = 16, 64
_capturing = threading.local()
_failure: list[str] = []              # the reason, once a compile/launch failure turned the kernel off (see disable)


@contextlib.contextmanager
def for_graph_capture():
    """Every FIR call of this thread takes the Triton kernel (impl "auto"): wrap a graph's warm-up and capture."""
    depth = getattr(_capturing, "depth", 0)
    _capturing.depth = depth + 1
    try:
        yield
    finally:
        _capturing.depth = depth


def applies(x: torch.Tensor, kernel: torch.Tensor, impl: str = "auto") -> bool:
    """Whether `fir4` takes this call (otherwise the caller uses the conv path); `impl` as in the module doc."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}; choose one of {IMPLS}")
    if impl == "torch" or _failure or triton is None or x.dim() != 4 or tuple(kernel.shape) != (4, 4):
        return False
    if not (x.is_cuda or _INTERPRET) or not x.is_contiguous():
        return False
    if torch.compiler.is_compiling() or x.requires_grad:
        return False
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    if not _INTERPRET and not _capable(x.device):
        return False
    if impl == "triton" or _INTERPRET:
        return True
    return x.numel() >= EAGER_MIN_ELEMENTS or getattr(_capturing, "depth", 0) > 0


_capable_devices: dict[int, bool] = {}


def _capable(device: torch.device) -> bool:
    """Triton supports compute capability 8.0 and newer (older GPUs, e.g. many 4 GB laptop cards, keep the conv)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _capable_devices:
        _capable_devices[index] = torch.cuda.get_device_capability(index) >= (8, 0)
    return _capable_devices[index]


def disable(reason: str) -> None:
    """Turn the kernel off for the rest of the process (a compile or launch failure), with one warning."""
    if not _failure:
        _failure.append(reason)
        warnings.warn(f"Triton FIR disabled, using PyTorch's conv instead: {reason}", RuntimeWarning, stacklevel=3)


def failure() -> str | None:
    """Why the kernel was turned off in this process, or None."""
    return _failure[0] if _failure else None


def fir4(x: torch.Tensor, kernel: torch.Tensor, pad: tuple[int, int], bias: torch.Tensor | None = None,
         out: torch.Tensor | None = None, negative_slope: float | None = None) -> torch.Tensor:
    """True 2-D convolution of every channel of x [N, C, H, W] with `kernel` [4, 4] after zero padding `pad`
    (before, after) on both axes, plus bias[c]: upfirdn2d(x, kernel, pad=pad) (+ bias); with `negative_slope`,
    leaky ReLU in the same pass. `out`: a contiguous tensor of the output's shape and dtype to write into."""
    n, c, h, w = x.shape
    p0, p1 = pad
    ho, wo = h + p0 + p1 - 3, w + p0 + p1 - 3
    if out is None:
        out = torch.empty((n, c, ho, wo), dtype=x.dtype, device=x.device)
    elif out.shape != (n, c, ho, wo) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {x.dtype} tensor of shape {(n, c, ho, wo)}")
    if out.numel() == 0:
        return out
    taps = kernel.to(device=x.device).contiguous()    # the module's buffer itself: no copy kernel per call
    b = bias.contiguous() if bias is not None else taps  # dummy pointer when HAS_BIAS is False
    n_tx = triton.cdiv(wo, _TILE_X)
    grid = (triton.cdiv(ho, _TILE_Y) * n_tx, n * c)
    _fir4_kernel[grid](x, out, taps, b, c, h, w, ho, wo, n_tx, 0.0 if negative_slope is None else negative_slope,
                       P0=p0, HAS_BIAS=bias is not None, ACT=negative_slope is not None,
                       TILE_Y=_TILE_Y, TILE_X=_TILE_X)
    return out


if triton is not None:

    @triton.jit
    def _fir4_kernel(x_ptr, out_ptr, taps_ptr, bias_ptr, C, H, W, HO, WO, n_tx, slope,
                     P0: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                     TILE_Y: tl.constexpr, TILE_X: tl.constexpr):
        pid_t = tl.program_id(0)
        plane = tl.program_id(1).to(tl.int64)                 # n * C + c
        oy = (pid_t // n_tx) * TILE_Y + tl.arange(0, TILE_Y)[:, None]
        ox = (pid_t % n_tx) * TILE_X + tl.arange(0, TILE_X)[None, :]
        om = (oy < HO) & (ox < WO)
        src = x_ptr + plane * H * W
        acc = tl.zeros([TILE_Y, TILE_X], dtype=tl.float32)
        for u in tl.static_range(4):
            iy = oy + (u - P0)
            rm = om & (iy >= 0) & (iy < H)
            for v in tl.static_range(4):
                ix = ox + (v - P0)
                m = rm & (ix >= 0) & (ix < W)
                val = tl.load(src + iy * W + ix, mask=m, other=0.0).to(tl.float32)
                acc += tl.load(taps_ptr + (3 - u) * 4 + (3 - v)).to(tl.float32) * val   # flipped: true conv
        if HAS_BIAS:
            acc += tl.load(bias_ptr + plane % C).to(tl.float32)
        if ACT:
            acc = tl.where(acc >= 0, acc, acc * slope)
        dst = out_ptr + plane * HO * WO
        tl.store(dst + oy * WO + ox, acc.to(out_ptr.dtype.element_ty), mask=om)
