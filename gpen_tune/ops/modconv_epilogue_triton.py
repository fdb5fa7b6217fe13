"""Triton kernels for the fused passes of the fused generator (channels-last, i.e. NHWC memory).

Twins of `gpen_tune.ops.modconv_epilogue.styled_epilogue` / `encoder_epilogue` (same signatures but the FIR as
[4, 4] taps), plus the ToRGB reduction `to_rgb` (twin: a bmm): same formulas, one read of each input and
one write of each output, fp32 arithmetic, the 4x4 FIR as 16 shifted loads over a 2-D pixel tile (neighbouring
taps hit L1). Used on CUDA only; `available()` says whether they can run (CPU tests run them through Triton's
interpreter, TRITON_INTERPRET=1). Offsets are int64: batch 128 at 1024 px exceeds 2**31 elements.
"""

from __future__ import annotations

import math

import torch

from gpen_tune.ops.triton_support import (
    INTERPRET,  # without Triton: the PyTorch twins in modconv_epilogue.py
    launch,
    tl,
    triton,
)

_SQRT2 = math.sqrt(2.0)


def available(device: torch.device | str) -> bool:
    """Triton kernels can run for tensors on `device` (CUDA, or any device under the interpreter)."""
    if triton is None:
        return False
    if INTERPRET:
        return True
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)   # what Triton supports; older GPUs: the twins


def _tiles(c: int) -> tuple[int, int, int]:
    """(BLOCK_C, TILE_Y, TILE_X): a [TILE_Y*TILE_X, BLOCK_C] tile of ~4096 elements, channels innermost."""
    block_c = min(64, triton.next_power_of_2(c))
    pixels = max(16, 4096 // block_c)
    tile_x = 16
    return block_c, pixels // tile_x, tile_x


# The per-layer sizes are not specialized on (Triton compiles one kernel per "divisible by 16" / "== 1" class of each
# integer argument: GPEN-BFR-512's decoder asked for eight styled and two blur kernels where one of each serves every
# layer; benchmarks/triton_compile.py). The channel count and the row strides stay specialized: the channel-innermost
# loads vectorize on them.
if triton is not None:

    @triton.jit(do_not_specialize=["H", "W", "HY", "WY", "n_tx"])
    def _styled_epilogue_kernel(y_ptr, f_ptr, out_ptr, d_ptr, bh_ptr, sh_ptr, bf_ptr, sf_ptr, taps_ptr, nw, gain,
                                C, H, W, HY, WY, n_tx, d_stride, sh_stride, sf_stride,
                                BLUR: tl.constexpr, PAD: tl.constexpr, TILE_Y: tl.constexpr,
                                TILE_X: tl.constexpr, BLOCK_C: tl.constexpr):
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        ty = pid_t // n_tx
        tx = pid_t % n_tx
        i = tl.arange(0, TILE_Y * TILE_X)
        py = ty * TILE_Y + i // TILE_X
        px = tx * TILE_X + i % TILE_X
        pm = (py < H) & (px < W)
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        m2 = pm[:, None] & cm[None, :]
        if BLUR:
            acc = tl.zeros([TILE_Y * TILE_X, BLOCK_C], dtype=tl.float32)
            for u in tl.static_range(4):
                yy = py + (u - PAD)
                for v in tl.static_range(4):
                    xx = px + (v - PAD)
                    ok = pm & (yy >= 0) & (yy < HY) & (xx >= 0) & (xx < WY)
                    tap = tl.load(taps_ptr + u * 4 + v)
                    off = ((b * HY + yy) * WY + xx) * C
                    val = tl.load(y_ptr + off[:, None] + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
                    acc += tap * val.to(tl.float32)
        else:
            off = ((b * H + py) * W + px) * C
            acc = tl.load(y_ptr + off[:, None] + c[None, :], mask=m2, other=0.0).to(tl.float32)
        d = tl.load(d_ptr + b * d_stride + c, mask=cm, other=0.0)
        bh = tl.load(bh_ptr + c, mask=cm, other=0.0)
        sh = tl.load(sh_ptr + b * sh_stride + c, mask=cm, other=0.0)
        a = acc * d[None, :] + bh[None, :]
        a = tl.where(a >= 0, a, a * 0.2) * gain * sh[None, :]
        pix = (b * H + py) * W + px
        out_off = pix * (2 * C)
        tl.store(out_ptr + out_off[:, None] + c[None, :], a.to(out_ptr.dtype.element_ty), mask=m2)
        fv = tl.load(f_ptr + (pix * C)[:, None] + c[None, :], mask=m2, other=0.0).to(tl.float32)
        bf = tl.load(bf_ptr + c, mask=cm, other=0.0)
        sf = tl.load(sf_ptr + b * sf_stride + c, mask=cm, other=0.0)
        g = fv * nw + bf[None, :]
        g = tl.where(g >= 0, g, g * 0.2) * gain * sf[None, :]
        tl.store(out_ptr + out_off[:, None] + C + c[None, :], g.to(out_ptr.dtype.element_ty), mask=m2)

    @triton.jit(do_not_specialize=["HWC"])
    def _bias_lrelu_kernel(z_ptr, bias_ptr, f_ptr, gain, C, HWC, BLOCK: tl.constexpr):
        b = tl.program_id(1).to(tl.int64)
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < HWC
        zb = z_ptr + b * HWC
        fb = f_ptr + b * HWC
        bias = tl.load(bias_ptr + i % C, mask=m, other=0.0)
        a = tl.load(zb + i, mask=m, other=0.0).to(tl.float32) + bias
        a = tl.where(a >= 0, a, a * 0.2) * gain
        tl.store(fb + i, a.to(f_ptr.dtype.element_ty), mask=m)

    @triton.jit(do_not_specialize=["H", "W", "HB", "WB", "n_tx"])
    def _blur_kernel(f_ptr, fb_ptr, taps_ptr, C, H, W, HB, WB, n_tx, PAD: tl.constexpr, TILE_Y: tl.constexpr,
                     TILE_X: tl.constexpr, BLOCK_C: tl.constexpr):
        pid_t = tl.program_id(0)
        pid_c = tl.program_id(1)
        b = tl.program_id(2).to(tl.int64)
        ty = pid_t // n_tx
        tx = pid_t % n_tx
        i = tl.arange(0, TILE_Y * TILE_X)
        py = ty * TILE_Y + i // TILE_X
        px = tx * TILE_X + i % TILE_X
        c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
        cm = c < C
        src = f_ptr + b * H * W * C                      # int64 scalar base; offsets below stay int32
        dst = fb_ptr + b * HB * WB * C
        acc = tl.zeros([TILE_Y * TILE_X, BLOCK_C], dtype=tl.float32)
        for u in tl.static_range(4):
            yy = py + (u - PAD)
            rok = (yy >= 0) & (yy < H)
            for v in tl.static_range(4):
                xx = px + (v - PAD)
                ok = rok & (xx >= 0) & (xx < W)
                tap = tl.load(taps_ptr + u * 4 + v)
                off = (yy * W + xx) * C
                val = tl.load(src + off[:, None] + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0)
                acc += tap * val.to(tl.float32)
        bm = (py < HB) & (px < WB)
        bo = (py * WB + px) * C
        tl.store(dst + bo[:, None] + c[None, :], acc.to(fb_ptr.dtype.element_ty), mask=bm[:, None] & cm[None, :])


    # ToRGB as a per-sample [HW, C] x [C, 3] reduction (iteration 2): reads the buffer once with channels contiguous,
    # 3 fp32 accumulators per pixel; replaces a skinny cuBLAS bmm (N=3) that ran at ~7x its memory floor.
    @triton.jit(do_not_specialize=["HW"])
    def _rgb_kernel(a_ptr, w_ptr, out_ptr, HW, C, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        b = tl.program_id(1).to(tl.int64)
        p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        pm = p < HW
        src = a_ptr + b * HW * C
        wb = w_ptr + b * C * 3
        acc0 = tl.zeros([BLOCK_P], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_P], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_P], dtype=tl.float32)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            cm = c < C
            x = tl.load(src + (p * C)[:, None] + c[None, :], mask=pm[:, None] & cm[None, :], other=0.0)
            x = x.to(tl.float32)
            w0 = tl.load(wb + c * 3, mask=cm, other=0.0).to(tl.float32)
            w1 = tl.load(wb + c * 3 + 1, mask=cm, other=0.0).to(tl.float32)
            w2 = tl.load(wb + c * 3 + 2, mask=cm, other=0.0).to(tl.float32)
            acc0 += tl.sum(x * w0[None, :], axis=1)
            acc1 += tl.sum(x * w1[None, :], axis=1)
            acc2 += tl.sum(x * w2[None, :], axis=1)
        dst = out_ptr + b * HW * 3 + p * 3
        tl.store(dst, acc0, mask=pm)
        tl.store(dst + 1, acc1, mask=pm)
        tl.store(dst + 2, acc2, mask=pm)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A [B, C] fp32 matrix the kernel can index as ptr + b * stride(0) + c (column slices stay views)."""
    t = t.float()
    return t if t.stride(1) == 1 else t.contiguous()


def _nhwc(x: torch.Tensor) -> bool:
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)


def styled_epilogue(y: torch.Tensor, f: torch.Tensor, d: torch.Tensor, b_h: torch.Tensor, s_h: torch.Tensor,
                    b_f: torch.Tensor, s_f: torch.Tensor, nw: float, taps2d: torch.Tensor | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of modconv_epilogue.styled_epilogue; y, f channels-last; taps2d: [4, 4] fp32 correlation taps
    or None.

    Returns [B, 2C, H, W] channels-last in y's dtype (written into `out` when given).
    """
    bsz, c, hy, wy = y.shape
    blur = taps2d is not None
    h, w = (hy - 1, wy - 1) if blur else (hy, wy)
    assert _nhwc(y) and _nhwc(f) and f.shape == (bsz, c, h, w), "channels-last y/f with matching shapes"
    if out is None:
        out = torch.empty((bsz, 2 * c, h, w), device=y.device, dtype=y.dtype, memory_format=torch.channels_last)
    block_c, tile_y, tile_x = _tiles(c)
    n_tx = triton.cdiv(w, tile_x)
    grid = (triton.cdiv(h, tile_y) * n_tx, triton.cdiv(c, block_c), bsz)
    d, s_h, s_f = (_rows(t) for t in (d, s_h, s_f))           # [B, C] views with unit column stride, any row stride
    launch(
        _styled_epilogue_kernel, grid, y, f, out, d, b_h.contiguous(), s_h, b_f.contiguous(), s_f,
        taps2d if blur else d, float(nw), _SQRT2, c, h, w, hy, wy, n_tx, d.stride(0), s_h.stride(0), s_f.stride(0),
        BLUR=blur, PAD=1, TILE_Y=tile_y, TILE_X=tile_x, BLOCK_C=block_c, num_warps=4,
    )
    return out


def encoder_epilogue(z: torch.Tensor, bias: torch.Tensor, taps2d: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton twin of modconv_epilogue.encoder_epilogue: f = sqrt2*lrelu(z+bias) and fb = blur(f, pad 2).

    Offsets inside one sample are int32: (H+1) * (W+1) * C must stay below 2**31 (asserted).
    """
    bsz, c, h, w = z.shape
    assert _nhwc(z) and (h + 1) * (w + 1) * c < 2**31, "channels-last z, int32 in-sample offsets"
    f = torch.empty_like(z, memory_format=torch.channels_last)
    hwc = h * w * c
    block = 2048
    launch(_bias_lrelu_kernel, (triton.cdiv(hwc, block), bsz), z, bias.contiguous(), f, _SQRT2, c, hwc, BLOCK=block,
           num_warps=4)
    if taps2d is None:
        return f, None
    hb, wb = h + 1, w + 1
    fb = torch.empty((bsz, c, hb, wb), device=z.device, dtype=z.dtype, memory_format=torch.channels_last)
    block_c, tile_y, tile_x = _tiles(c)
    n_tx = triton.cdiv(wb, tile_x)
    grid = (triton.cdiv(hb, tile_y) * n_tx, triton.cdiv(c, block_c), bsz)
    launch(_blur_kernel, grid, f, fb, taps2d, c, h, w, hb, wb, n_tx, PAD=2, TILE_Y=tile_y, TILE_X=tile_x,
           BLOCK_C=block_c, num_warps=4)
    return f, fb


def to_rgb(a: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    """[B, HW, C] (C contiguous) x [B, C, 3] -> [B, HW, 3] fp32: the ToRGB 1x1 conv of a channels-last buffer."""
    bsz, hw, c = a.shape
    assert a.is_contiguous() and wt.shape == (bsz, c, 3) and hw * c < 2**31
    wt = wt.contiguous()
    out = torch.empty((bsz, hw, 3), device=a.device, dtype=torch.float32)
    block_c = min(64, triton.next_power_of_2(c))
    block_p = 64
    launch(_rgb_kernel, (triton.cdiv(hw, block_p), bsz), a, wt, out, hw, c, BLOCK_P=block_p, BLOCK_C=block_c,
           num_warps=4)
    return out
