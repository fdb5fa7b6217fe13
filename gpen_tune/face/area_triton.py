"""The detector's area resize (summed-area-table look-ups) as one Triton kernel.

Why: in PyTorch, `mtcnn_batched.area_resize` is ~60 small tensor calls (bounds, four gathers, sums, mean,
normalisation, mask, layout), run once per P-Net scale and once per R-Net / O-Net chunk. Inside the P-Net CUDA
graph each call is a kernel that has to find free SMs next to the generator's; outside it each call is a trip
through the GIL, which a busy folder run shares among dozens of threads. One kernel does the same arithmetic per
output value: integer bounds, the four table reads, an IEEE float32 division and the same normalisation, so
the result is bit-identical to the PyTorch version (tested in Triton's interpreter and on CUDA).
"""

from __future__ import annotations

import os

import torch

from gpen_tune.ops.triton_support import INTERPRET as _INTERPRET  # without Triton the PyTorch version is used
from gpen_tune.ops.triton_support import tl, triton

# GPEN_TUNE_AREA=torch: the PyTorch version even where the kernel could run (A/B measurements)
USE_TRITON = os.environ.get("GPEN_TUNE_AREA", "") != "torch"
BLOCK = 256


def applies(table: torch.Tensor, dtype: torch.dtype) -> bool:
    return (USE_TRITON and triton is not None and (table.is_cuda or _INTERPRET) and dtype == torch.float32
            and table.is_contiguous() and table.dim() == 4 and table.shape[-1] == 3)


def area_resize(table: torch.Tensor, img, top, left, in_h, in_w, out_h, out_w, canvas_h: int, canvas_w: int,
                mean: float, scale: float) -> torch.Tensor:
    """[N, 3, canvas_h, canvas_w] float32, as `mtcnn_batched.area_resize` (the per-item vectors are int64)."""
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
