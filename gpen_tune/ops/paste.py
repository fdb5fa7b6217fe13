"""Paste-back of all faces of one image in one call: a Triton kernel and its PyTorch twin, one signature.

Why: the device paste (`gpen_tune.face.paste.paste_faces_device`) once ran ~25 PyTorch calls per face (grid,
two grid_samples, blend, winner
update), ~130 per photo of five faces, each needing the GIL: in a folder run the paste threads became the limiting
stage (H200, 20261201-042746: finish workers 87 % busy, the GPU stage blocked on them 16 % of the run). Here one
launch does the whole union box of the image's faces: per pixel, every face whose paste rectangle holds it is
sampled (bilinear, border-clamped for the crop and zero outside for the mask, as grid_sample with
align_corners=True) and the faces blend by their masks, normalised where they overlap:
out = bg + s * sum_i m_i (face_i - bg) / max(1, sum_i m_i), rounded half up. Same rule and rectangles as the CPU
paste (`gpen_tune.face.paste`).
Sampling positions are float32 (the CPU path quantises them to 1/32 px): within 2 grey levels of it, like the
PyTorch twin `paste_union_torch` (the same float32 arithmetic as tensor ops, one face at a time), which runs
wherever Triton does not; `impl` chooses ("auto": the kernel where Triton runs on that device).
"""

from __future__ import annotations

import torch

from gpen_tune.ops.triton_support import kernel_runs_on, resolve_impl, tl, triton

BLOCK = 256


def available(device: torch.device) -> bool:
    """Whether the Triton kernel can run on `device` (CUDA with Triton, or Triton's interpreter in the tests)."""
    return kernel_runs_on(device)


def warm_up(device: torch.device) -> None:
    """Compile the kernel now (a folder run calls this before its timed work; ~1 s once per process)."""
    if not available(device):
        return
    size = 4
    paste_union(torch.zeros((2, 2, 3), dtype=torch.uint8, device=device),
                torch.zeros((1, size, size, 3), dtype=torch.uint8, device=device),
                torch.ones((1, size, size), device=device), torch.zeros((1, 6), device=device),
                torch.zeros((1, 4), dtype=torch.int32, device=device), 1.0)


def paste_union(bg: torch.Tensor, crops: torch.Tensor, masks: torch.Tensor, coefs: torch.Tensor,
                rois: torch.Tensor, strength: float, impl: str = "auto") -> torch.Tensor:
    """The pasted union box, [h, w, 3] uint8.

    bg: input pixels of the union box [h, w, 3] uint8. crops: restored faces [F, S, S, 3] uint8. masks: [F, S, S]
    or [1, S, S] float32 (one shared). coefs: [F, 6] float32, the affine box (x, y) -> crop (u, v) per face.
    rois: [F, 4] int32 paste rectangles (x0, y0, x1, y1) in box coordinates. impl: "auto" | "triton" | "torch".
    """
    if resolve_impl(impl, bg.device) == "torch":
        return paste_union_torch(bg, crops, masks, coefs, rois, strength)
    h, w = bg.shape[:2]
    n_faces, size = crops.shape[0], crops.shape[1]
    out = torch.empty_like(bg)
    mask_stride = 0 if masks.shape[0] == 1 else size * size
    grid = (triton.cdiv(h * w, BLOCK),)
    _paste_kernel[grid](bg, out, crops.contiguous(), masks.contiguous(), coefs.contiguous(), rois.contiguous(),
                        n_faces, w, h, size, mask_stride, float(strength), BLOCK=BLOCK)
    return out


def _bilinear(plane: torch.Tensor, u: torch.Tensor, v: torch.Tensor, zero_outside: bool) -> torch.Tensor:
    """Bilinear samples of `plane` [S, S, C] at float32 positions (u, v) [N]: zero outside the crop (the mask) or
    with the position clamped to it (the pixels), as the kernel."""
    size = plane.shape[0]
    if not zero_outside:
        u, v = u.clamp(0.0, size - 1.0), v.clamp(0.0, size - 1.0)
    u0, v0 = torch.floor(u), torch.floor(v)
    fu, fv = u - u0, v - v0
    iu, iv = u0.to(torch.int64), v0.to(torch.int64)
    out = torch.zeros((u.shape[0], plane.shape[2]), dtype=torch.float32, device=plane.device)
    for dy in (0, 1):
        for dx in (0, 1):
            ju, jv = iu + dx, iv + dy
            ok = (ju >= 0) & (ju < size) & (jv >= 0) & (jv < size)
            wgt = (fu if dx else 1.0 - fu) * (fv if dy else 1.0 - fv)
            vals = plane[jv.clamp(0, size - 1), ju.clamp(0, size - 1)].float()
            out += (wgt * ok)[:, None] * vals
    return out


def paste_union_torch(bg: torch.Tensor, crops: torch.Tensor, masks: torch.Tensor, coefs: torch.Tensor,
                      rois: torch.Tensor, strength: float) -> torch.Tensor:
    """The kernel's PyTorch twin: per face, its rectangle's mask and pixels sampled and accumulated (sum of masks,
    sum of mask * (pixel - bg)), then the normalised blend, in the kernel's order of float32 operations."""
    base = bg.float()
    total = torch.zeros(bg.shape[:2], dtype=torch.float32, device=bg.device)
    acc = torch.zeros(bg.shape, dtype=torch.float32, device=bg.device)
    rois_host, coefs_f = rois.tolist(), coefs.float()
    for f, (x0, y0, x1, y1) in enumerate(rois_host):
        if x1 <= x0 or y1 <= y0:
            continue
        ys, xs = torch.meshgrid(torch.arange(y0, y1, device=bg.device, dtype=torch.float32),
                                torch.arange(x0, x1, device=bg.device, dtype=torch.float32), indexing="ij")
        xs, ys = xs.reshape(-1), ys.reshape(-1)
        c = coefs_f[f]
        u = c[0] * xs + c[1] * ys + c[2]
        v = c[3] * xs + c[4] * ys + c[5]
        mask = masks[0 if masks.shape[0] == 1 else f][..., None]
        m = _bilinear(mask, u, v, zero_outside=True)[:, 0]
        px = _bilinear(crops[f], u, v, zero_outside=False)
        b = base[y0:y1, x0:x1].reshape(-1, 3)
        total[y0:y1, x0:x1] += m.view(y1 - y0, x1 - x0)
        acc[y0:y1, x0:x1] += (m[:, None] * (px - b)).view(y1 - y0, x1 - x0, 3)
    ratio = float(strength) / torch.clamp(total, min=1.0)
    out = torch.floor(base + acc * ratio[..., None] + 0.5).clamp(0.0, 255.0)
    return out.to(torch.uint8)


if triton is not None:

    # sizes are not specialised on (Triton would compile a variant per divisibility of each): one compile per run
    @triton.jit(do_not_specialize=["n_faces", "width", "height", "size", "mask_stride"])
    def _paste_kernel(bg_ptr, out_ptr, crops_ptr, mask_ptr, coef_ptr, roi_ptr, n_faces, width, height, size,
                      mask_stride, strength, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        inside = offs < width * height
        y = offs // width
        x = offs - y * width
        row_first = (pid * BLOCK) // width
        row_last = (pid * BLOCK + BLOCK - 1) // width
        b0 = tl.load(bg_ptr + offs * 3, mask=inside, other=0).to(tl.float32)
        b1 = tl.load(bg_ptr + offs * 3 + 1, mask=inside, other=0).to(tl.float32)
        b2 = tl.load(bg_ptr + offs * 3 + 2, mask=inside, other=0).to(tl.float32)
        a0 = tl.zeros([BLOCK], dtype=tl.float32)             # sum of m * (pixel - bg) per channel
        a1 = tl.zeros([BLOCK], dtype=tl.float32)
        a2 = tl.zeros([BLOCK], dtype=tl.float32)
        total = tl.zeros([BLOCK], dtype=tl.float32)          # sum of the masks
        xf = x.to(tl.float32)
        yf = y.to(tl.float32)
        top = (size - 1).to(tl.float32)
        for f in range(n_faces):
            rx0 = tl.load(roi_ptr + f * 4)
            ry0 = tl.load(roi_ptr + f * 4 + 1)
            rx1 = tl.load(roi_ptr + f * 4 + 2)
            ry1 = tl.load(roi_ptr + f * 4 + 3)
            if (row_last >= ry0) & (row_first < ry1):           # this block's rows meet the face's rectangle
                hit = inside & (x >= rx0) & (x < rx1) & (y >= ry0) & (y < ry1)
                c = coef_ptr + f * 6
                u = tl.load(c) * xf + tl.load(c + 1) * yf + tl.load(c + 2)
                v = tl.load(c + 3) * xf + tl.load(c + 4) * yf + tl.load(c + 5)
                # mask: bilinear, zero outside the crop
                u0 = tl.floor(u)
                v0 = tl.floor(v)
                fu = u - u0
                fv = v - v0
                iu = u0.to(tl.int32)
                iv = v0.to(tl.int32)
                mbase = mask_ptr + f * mask_stride
                m = tl.zeros([BLOCK], dtype=tl.float32)
                for dy in tl.static_range(2):
                    for dx in tl.static_range(2):
                        ju = iu + dx
                        jv = iv + dy
                        ok = hit & (ju >= 0) & (ju < size) & (jv >= 0) & (jv < size)
                        wgt = (fu if dx == 1 else 1.0 - fu) * (fv if dy == 1 else 1.0 - fv)
                        m += wgt * tl.load(mbase + jv * size + ju, mask=ok, other=0.0)
                win = hit & (m > 0.0)
                # pixels: bilinear with the position clamped to the crop (border padding)
                uc = tl.minimum(tl.maximum(u, 0.0), top)
                vc = tl.minimum(tl.maximum(v, 0.0), top)
                pu0 = tl.floor(uc)
                pv0 = tl.floor(vc)
                gu = uc - pu0
                gv = vc - pv0
                qu = pu0.to(tl.int32)
                qv = pv0.to(tl.int32)
                cbase = crops_ptr + f * size * size * 3
                p0 = tl.zeros([BLOCK], dtype=tl.float32)
                p1 = tl.zeros([BLOCK], dtype=tl.float32)
                p2 = tl.zeros([BLOCK], dtype=tl.float32)
                for dy in tl.static_range(2):
                    for dx in tl.static_range(2):
                        ju = qu + dx
                        jv = qv + dy
                        ok = win & (ju < size) & (jv < size)
                        wgt = (gu if dx == 1 else 1.0 - gu) * (gv if dy == 1 else 1.0 - gv)
                        at = cbase + (jv * size + ju) * 3
                        p0 += wgt * tl.load(at, mask=ok, other=0).to(tl.float32)
                        p1 += wgt * tl.load(at + 1, mask=ok, other=0).to(tl.float32)
                        p2 += wgt * tl.load(at + 2, mask=ok, other=0).to(tl.float32)
                a0 += tl.where(win, m * (p0 - b0), 0.0)
                a1 += tl.where(win, m * (p1 - b1), 0.0)
                a2 += tl.where(win, m * (p2 - b2), 0.0)
                total += tl.where(hit, m, 0.0)
        ratio = strength / tl.maximum(total, 1.0)
        o0 = tl.minimum(tl.maximum(tl.floor(b0 + a0 * ratio + 0.5), 0.0), 255.0)
        o1 = tl.minimum(tl.maximum(tl.floor(b1 + a1 * ratio + 0.5), 0.0), 255.0)
        o2 = tl.minimum(tl.maximum(tl.floor(b2 + a2 * ratio + 0.5), 0.0), 255.0)
        tl.store(out_ptr + offs * 3, o0.to(tl.uint8), mask=inside)
        tl.store(out_ptr + offs * 3 + 1, o1.to(tl.uint8), mask=inside)
        tl.store(out_ptr + offs * 3 + 2, o2.to(tl.uint8), mask=inside)
