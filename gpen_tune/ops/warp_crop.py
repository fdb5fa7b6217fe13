"""Face crops cut on the device: every face of one image in one call, the same bits as `align.warp_crop`.

Why: in a folder run each crop was a cv2 call in a prepare thread, and the GPU stage then copied every crop into
a pinned buffer and uploaded it (32 copies per batch, each a trip through the GIL that the detector and the GPU
stage wait on). With the image on the device (the GPU paste needs it there anyway) the crops are cut where the
generator reads them: one launch per image, and the GPU stage stacks device tensors.

How: the positions are the integer tables of `align.crop_tables` (1/32 px, separable in row and column); per
output pixel the four neighbours are clamped to the image (border replicate) and blended with the integer
weights (32 - fx)(32 - fy), fx(32 - fy), (32 - fx)fy, fx fy and rounded half up, as OpenCV's fixed-point remap
that `warp_crop` calls on the CPU (tested bit-equal in Triton's interpreter and on CUDA).

Two implementations with one signature: the Triton kernel (one launch per image) and its PyTorch twin (the same
integer arithmetic as tensor ops), chosen by `impl` ("auto": the kernel where Triton runs on that device).
"""

from __future__ import annotations

import torch

from gpen_tune.ops.triton_support import kernel_runs_on, resolve_impl, tl, triton

BLOCK = 512


def available(device: torch.device) -> bool:
    """Whether the Triton kernel can run on `device` (CUDA with Triton, or Triton's interpreter in the tests)."""
    return kernel_runs_on(device)


def warp_crops(image: torch.Tensor, tables: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """[F, S, S, 3] uint8 crops of `image` ([H, W, 3] uint8) at `tables` ([F, 4, S] int32 from
    `align.crop_tables`, same device), on the current stream. impl: "auto" | "triton" | "torch"."""
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[2] != 3:
        raise ValueError(f"warp_crops takes an [H, W, 3] uint8 image, got {tuple(image.shape)} {image.dtype}")
    image = image.contiguous()
    tables = tables.to(torch.int32).contiguous()
    n_faces, size = tables.shape[0], tables.shape[2]
    if resolve_impl(impl, image.device) == "torch":
        return warp_crops_torch(image, tables)
    out = torch.empty((n_faces, size, size, 3), dtype=torch.uint8, device=image.device)
    if n_faces == 0:
        return out
    grid = (n_faces, triton.cdiv(size * size, BLOCK))
    _warp_kernel[grid](image, tables, out, image.shape[0], image.shape[1], size, BLOCK=BLOCK)
    return out


def warp_crops_torch(image: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """The kernel's PyTorch twin: the same int32 positions, clamps, weights and rounding as tensor ops."""
    n_faces, size = tables.shape[0], tables.shape[2]
    h, w = image.shape[:2]
    if n_faces == 0:
        return torch.empty((0, size, size, 3), dtype=torch.uint8, device=image.device)
    t = tables.to(torch.int64)
    x = t[:, 0, None, :] + t[:, 1, :, None]                  # [F, S(row), S(col)] in 1/32 px
    y = t[:, 2, None, :] + t[:, 3, :, None]
    fx, fy = x & 31, y & 31
    ix = (x >> 5).clamp(-32768, 32767)                      # int16 saturation, as the CPU path's map
    iy = (y >> 5).clamp(-32768, 32767)
    x0, x1 = ix.clamp(0, w - 1), (ix + 1).clamp(0, w - 1)
    y0, y1 = iy.clamp(0, h - 1), (iy + 1).clamp(0, h - 1)
    flat = image.reshape(-1, 3).to(torch.int64)

    def at(yy: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
        return flat[(yy * w + xx).reshape(-1)].reshape(n_faces, size, size, 3)

    acc = (((32 - fx) * (32 - fy))[..., None] * at(y0, x0) + (fx * (32 - fy))[..., None] * at(y0, x1)
           + ((32 - fx) * fy)[..., None] * at(y1, x0) + (fx * fy)[..., None] * at(y1, x1))
    return ((acc + 512) >> 10).to(torch.uint8)


def warm_up(device: torch.device) -> None:
    """Compile the kernel now (before a folder run's timed work)."""
    if available(device):
        warp_crops(torch.zeros((4, 4, 3), dtype=torch.uint8, device=device),
                   torch.zeros((1, 4, 2), dtype=torch.int32, device=device))


if triton is not None:

    @triton.jit(do_not_specialize=["height", "width", "size"])
    def _warp_kernel(img_ptr, tab_ptr, out_ptr, height, width, size, BLOCK: tl.constexpr):
        face = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        live = offs < size * size
        r = offs // size
        c = offs - r * size
        tab = tab_ptr + face * 4 * size
        x = tl.load(tab + c, mask=live, other=0) + tl.load(tab + size + r, mask=live, other=0)
        y = tl.load(tab + 2 * size + c, mask=live, other=0) + tl.load(tab + 3 * size + r, mask=live, other=0)
        fx = x & 31
        fy = y & 31
        ix = tl.minimum(tl.maximum(x >> 5, -32768), 32767)      # int16 saturation, as the CPU path's map
        iy = tl.minimum(tl.maximum(y >> 5, -32768), 32767)
        x0 = tl.minimum(tl.maximum(ix, 0), width - 1).to(tl.int64)
        x1 = tl.minimum(tl.maximum(ix + 1, 0), width - 1).to(tl.int64)
        y0 = tl.minimum(tl.maximum(iy, 0), height - 1).to(tl.int64)
        y1 = tl.minimum(tl.maximum(iy + 1, 0), height - 1).to(tl.int64)
        w00 = (32 - fx) * (32 - fy)
        w01 = fx * (32 - fy)
        w10 = (32 - fx) * fy
        w11 = fx * fy
        row = width.to(tl.int64) * 3
        a00 = img_ptr + y0 * row + x0 * 3
        a01 = img_ptr + y0 * row + x1 * 3
        a10 = img_ptr + y1 * row + x0 * 3
        a11 = img_ptr + y1 * row + x1 * 3
        dst = out_ptr + (face.to(tl.int64) * size * size + offs) * 3
        for ch in tl.static_range(3):
            p00 = tl.load(a00 + ch, mask=live, other=0).to(tl.int32)
            p01 = tl.load(a01 + ch, mask=live, other=0).to(tl.int32)
            p10 = tl.load(a10 + ch, mask=live, other=0).to(tl.int32)
            p11 = tl.load(a11 + ch, mask=live, other=0).to(tl.int32)
            acc = w00 * p00 + w01 * p01 + w10 * p10 + w11 * p11              # in 1/1024, at most 255 * 1024
            tl.store(dst + ch, ((acc + 512) >> 10).to(tl.uint8), mask=live)
