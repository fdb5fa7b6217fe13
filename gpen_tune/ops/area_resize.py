"""Area resize of rectangles of a batch from its summed-area table: a PyTorch twin and one Triton kernel.

An "area" resize (F.interpolate's mode="area", i.e. adaptive average pooling) is, for every output pixel, the mean
of an integer rectangle of input pixels: four look-ups in the batch's summed-area table (`integral`). The batched
MTCNN driver cuts its pyramid levels and its R-Net / O-Net crops this way.

Why the kernel: the twin is ~60 small tensor calls (bounds, four gathers, sums, mean, normalisation, mask,
layout), run once per P-Net scale and once per R-Net / O-Net chunk. Inside the P-Net CUDA graph each call is a
kernel that has to find free SMs next to the generator's; outside it each call is a trip through the GIL, which a
busy folder run shares among dozens of threads. The kernel does the same arithmetic per output value: integer
bounds, the four table reads, an IEEE float32 division and the same normalisation, so its result is
bit-identical to the twin's (tested in Triton's interpreter and on CUDA).

`impl`: "auto" (the kernel where it can run: float32 on CUDA tensors, or Triton's interpreter), "torch" (the twin)
or "triton" (the kernel; ValueError where it cannot run).
"""

from __future__ import annotations

from typing import Literal

import torch

from gpen_tune.ops.triton_support import INTERPRET, tl, triton

Impl = Literal["auto", "torch", "triton"]
IMPLS = ("auto", "torch", "triton")
BLOCK = 256


def integral(canvas: torch.Tensor) -> torch.Tensor:
    """Summed-area table [B, H+1, W+1, 3] of a uint8 [B, H, W, 3] batch, in exact integers."""
    b, h, w, _ = canvas.shape
    dtype = torch.int32 if 255 * h * w < 2**31 else torch.int64
    table = torch.zeros((b, h + 1, w + 1, 3), dtype=dtype, device=canvas.device)
    table[:, 1:, 1:] = canvas.to(dtype).cumsum(1, dtype=dtype).cumsum(2, dtype=dtype)
    return table


def uses_triton(table: torch.Tensor, dtype: torch.dtype, impl: Impl = "auto") -> bool:
    """Whether `area_resize(table, dtype, ..., impl=impl)` runs the Triton kernel."""
    if impl not in IMPLS:
        raise ValueError(f"area impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "torch":
        return False
    available = (triton is not None and (table.is_cuda or INTERPRET) and dtype == torch.float32
                 and table.is_contiguous() and table.dim() == 4 and table.shape[-1] == 3)
    if impl == "triton" and not available:
        raise ValueError("area impl 'triton' needs Triton, float32 and a CUDA table (or TRITON_INTERPRET=1): "
                         "use 'auto'")
    return available


def area_resize(table: torch.Tensor, dtype: torch.dtype, img, top, left, in_h, in_w, out_h, out_w,
                canvas_h: int, canvas_w: int, mean: float, scale: float, impl: Impl = "auto") -> torch.Tensor:
    """[N, 3, canvas_h, canvas_w] in `dtype`: for each n, the rectangle (top, left, in_h, in_w) of image img[n]
    area-resized to (out_h[n], out_w[n]) as F.interpolate(mode="area") does, then (value - mean) * scale; zeros
    beyond (out_h, out_w). `table`: the batch's summed-area table (`integral`); the per-item vectors are int64."""
    if uses_triton(table, dtype, impl):
        return area_resize_triton(table, img, top, left, in_h, in_w, out_h, out_w, canvas_h, canvas_w, mean, scale)
    return area_resize_torch(table, dtype, img, top, left, in_h, in_w, out_h, out_w, canvas_h, canvas_w, mean,
                             scale)


def area_resize_torch(table: torch.Tensor, dtype: torch.dtype, img, top, left, in_h, in_w, out_h, out_w,
                      canvas_h: int, canvas_w: int, mean: float, scale: float) -> torch.Tensor:
    """The twin, in tensor calls."""
    r0, r1, r_ok = _area_bounds(top, in_h, out_h, canvas_h)     # [N, canvas_h]
    c0, c1, c_ok = _area_bounds(left, in_w, out_w, canvas_w)    # [N, canvas_w]
    rows, cols = table.shape[1], table.shape[2]
    base = (img * rows)[:, None, None]
    flat = table.view(-1, 3)

    def at(r, c):
        return flat[((base + r[:, :, None]) * cols + c[:, None, :]).reshape(-1)]

    total = at(r1, c1) - at(r0, c1) - at(r1, c0) + at(r0, c0)
    count = ((r1 - r0)[:, :, None] * (c1 - c0)[:, None, :]).clamp(min=1)
    averaged = total.view(*count.shape, 3).to(dtype) / count[..., None].to(dtype)
    out = (averaged - mean) * scale
    out = out * (r_ok[:, :, None] & c_ok[:, None, :])[..., None]   # outside the image: 0 (like zero padding)
    return out.permute(0, 3, 1, 2).contiguous()


def _area_bounds(start, in_len, out_len, n: int):
    """Adaptive-average-pool bounds of output cells 0..n-1: [floor(i*in/out), ceil((i+1)*in/out)) + start.
    Cells at or beyond out_len get an empty range and ok=False."""
    i = torch.arange(n, device=start.device)[None]
    in_len, out_len, start = in_len[:, None], out_len[:, None], start[:, None]
    ok = i < out_len
    lo = torch.where(ok, start + (i * in_len) // out_len, 0)
    hi = torch.where(ok, start + ((i + 1) * in_len + out_len - 1) // out_len, 0)
    return lo, hi, ok


def area_resize_triton(table: torch.Tensor, img, top, left, in_h, in_w, out_h, out_w, canvas_h: int,
                       canvas_w: int, mean: float, scale: float) -> torch.Tensor:
    """The kernel: [N, 3, canvas_h, canvas_w] float32, the twin's bits."""
    n = img.shape[0]
    out = torch.empty((n, 3, canvas_h, canvas_w), dtype=torch.float32, device=table.device)
    if n == 0:
        return out
    vecs = (img, top, left, in_h, in_w, out_h, out_w)
    grid = (n, triton.cdiv(canvas_h * canvas_w, BLOCK))
    _area_kernel[grid](table, out, *vecs, *(v.stride(0) for v in vecs), table.shape[1], table.shape[2],
                       canvas_h, canvas_w, mean, scale, BLOCK=BLOCK)
    return out


if triton is not None:

    @triton.jit(do_not_specialize=["rows", "cols", "canvas_h", "canvas_w"])
    def _area_kernel(table_ptr, out_ptr, img_ptr, top_ptr, left_ptr, inh_ptr, inw_ptr, outh_ptr, outw_ptr,
                     s_img, s_top, s_left, s_inh, s_inw, s_outh, s_outw, rows, cols, canvas_h, canvas_w,
                     mean, scale, BLOCK: tl.constexpr):
        item = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        plane = canvas_h * canvas_w
        live = offs < plane
        r = offs // canvas_w
        c = offs - r * canvas_w
        img = tl.load(img_ptr + item * s_img)
        top = tl.load(top_ptr + item * s_top)
        left = tl.load(left_ptr + item * s_left)
        in_h = tl.load(inh_ptr + item * s_inh)
        in_w = tl.load(inw_ptr + item * s_inw)
        out_h = tl.load(outh_ptr + item * s_outh)
        out_w = tl.load(outw_ptr + item * s_outw)
        r64 = r.to(tl.int64)
        c64 = c.to(tl.int64)
        ok = live & (r64 < out_h) & (c64 < out_w)
        safe_h = tl.maximum(out_h, 1)
        safe_w = tl.maximum(out_w, 1)
        r0 = tl.where(ok, top + (r64 * in_h) // safe_h, 0)
        r1 = tl.where(ok, top + ((r64 + 1) * in_h + safe_h - 1) // safe_h, 0)
        c0 = tl.where(ok, left + (c64 * in_w) // safe_w, 0)
        c1 = tl.where(ok, left + ((c64 + 1) * in_w + safe_w - 1) // safe_w, 0)
        count = tl.maximum((r1 - r0) * (c1 - c0), 1).to(tl.float32)
        base = img * rows
        a = ((base + r1) * cols + c1) * 3
        b = ((base + r0) * cols + c1) * 3
        d = ((base + r1) * cols + c0) * 3
        e = ((base + r0) * cols + c0) * 3
        for ch in tl.static_range(3):
            total = (tl.load(table_ptr + a + ch, mask=ok, other=0) - tl.load(table_ptr + b + ch, mask=ok, other=0)
                     - tl.load(table_ptr + d + ch, mask=ok, other=0) + tl.load(table_ptr + e + ch, mask=ok, other=0))
            value = (tl.math.div_rn(total.to(tl.float32), count) - mean) * scale
            value = tl.where(ok, value, 0.0)
            tl.store(out_ptr + (item * 3 + ch) * plane + offs, value, mask=live)
