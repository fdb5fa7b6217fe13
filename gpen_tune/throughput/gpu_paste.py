"""Paste-back on the GPU: the same region-only paste as `gpen_tune.face.paste.paste_faces`, with grid_sample.

Only the box that covers every face's inverse-warped crop is uploaded (uint8), composited on the device and
downloaded (uint8); the restored crops are already there, so a face never makes the device->host->device round
trip. Per face, the crop and its soft mask are sampled into the face's own rectangle (bilinear, replicate border
for pixels and zero border for the mask, like the CPU path's cv2.warpAffine), and the CPU path's rule is kept:
at every pixel the face with the larger mask wins and blends with the *input* pixel by its mask value.

Matches the CPU path to within 2 grey levels (cv2 quantises sampling positions to 1/32 px, grid_sample does
not; see tests/test_throughput.py). Runs on any torch device, so the CPU tests check it against the CPU paste.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.ops.transfer import to_device_async
from gpen_tune.throughput import paste_triton

SMOOTH = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16.0


@dataclass
class DeviceFace:
    """One restored face on the device: crop [S,S,3] uint8 RGB, inverse affine crop->image (2x3), mask [S,S]."""

    restored: torch.Tensor
    inverse: np.ndarray
    mask: np.ndarray | torch.Tensor
    soften: bool = False       # the CPU path's 3x3 smoothing of small faces


def _region(inverse: np.ndarray, size: int, width: int, height: int) -> tuple[int, int, int, int] | None:
    """Same rectangle as the CPU path's `paste_region` (kept here so GPU and CPU touch the same pixels)."""
    from gpen_tune.face.paste import paste_region

    return paste_region(inverse, size, width, height)


def _forward(inverse: np.ndarray) -> np.ndarray:
    full = np.vstack([np.asarray(inverse, np.float64), [0.0, 0.0, 1.0]])
    return np.linalg.inv(full)[:2]


def _grid(fwd: np.ndarray, roi: tuple[int, int, int, int], size: int, device: torch.device) -> torch.Tensor:
    """[1,h,w,2] grid_sample coordinates (align_corners=True) of the roi's pixel centres in crop space."""
    x0, y0, x1, y1 = roi
    ys = torch.arange(y0, y1, device=device, dtype=torch.float64)
    xs = torch.arange(x0, x1, device=device, dtype=torch.float64)
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    a = torch.as_tensor(fwd, dtype=torch.float64, device=device)
    u = a[0, 0] * gx + a[0, 1] * gy + a[0, 2]
    v = a[1, 0] * gx + a[1, 1] * gy + a[1, 2]
    scale = 2.0 / (size - 1)
    return torch.stack([u * scale - 1.0, v * scale - 1.0], dim=-1).unsqueeze(0).float()


def _soften(face: torch.Tensor) -> torch.Tensor:
    """[S,S,3] or [k,S,S,3] uint8 -> the same 3x3 smoothing as the CPU path (reflect-101 border), rounded back to
    uint8. Every plane is filtered on its own, so a batch gives each face its own result (the weights are
    multiples of 1/16 and the pixels integers: the sums are exact in float32 whatever the order)."""
    batched = face.dim() == 4
    faces = face if batched else face[None]
    k, size = faces.shape[0], faces.shape[1]
    x = faces.permute(0, 3, 1, 2).reshape(k * 3, 1, size, size).float()   # [k*3,1,S,S]
    x = F.pad(x, (1, 1, 1, 1), mode="reflect")
    y = F.conv2d(x, SMOOTH.to(x.device).view(1, 1, 3, 3))
    out = y.round().clamp(0, 255).to(torch.uint8).view(k, 3, size, size).permute(0, 2, 3, 1)
    return out if batched else out[0]


# GPEN_TUNE_PASTE=torch: the PyTorch version even where the Triton kernel could run (A/B measurements)
USE_TRITON = os.environ.get("GPEN_TUNE_PASTE", "") != "torch"


@torch.inference_mode()
def paste_faces_device(base: np.ndarray, faces: Sequence[DeviceFace], strength: float = 1.0,
                       device: torch.device | str | None = None, base_device: torch.Tensor | None = None,
                       ) -> np.ndarray:
    """A copy of `base` [H,W,3] uint8 with the faces pasted, computed on `device` (default: the faces' device).

    `base_device`: the same pixels already on that device (the folder runner uploaded them to cut the faces), read
    instead of uploading the faces' union box again. On CUDA with Triton: one kernel for all faces
    (`paste_triton`); else the PyTorch version below."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    if base.dtype != np.uint8:
        raise ValueError("device paste handles uint8 images; use the CPU paste for 16-bit images")
    strength = min(float(strength), 1.0)
    dev = torch.device(device) if device is not None else faces[0].restored.device
    h, w = base.shape[:2]
    rois = [_region(f.inverse, f.restored.shape[0], w, h) for f in faces]
    boxes = [r for r in rois if r is not None]
    if not boxes:
        return out
    ux0, uy0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    ux1, uy1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    if base_device is not None and base_device.device == dev:
        src = base_device[uy0:uy1, ux0:ux1].contiguous()
    else:
        src = torch.from_numpy(np.ascontiguousarray(base[uy0:uy1, ux0:ux1]))
        if dev.type == "cuda":
            src = src.pin_memory()
        src = src.to(dev, non_blocking=True)                                # [h,w,3] input pixels, uint8
    kept = [(f, r) for f, r in zip(faces, rois, strict=True) if r is not None]
    if USE_TRITON and paste_triton.available(dev) and len({f.restored.shape for f, _ in kept}) == 1:
        out[uy0:uy1, ux0:ux1] = _paste_triton(src, kept, (ux0, uy0), strength, dev).cpu().numpy()
        return out
    bg = src.float()
    canvas = bg.clone()
    best = torch.zeros(bg.shape[:2], device=dev)                            # largest mask so far per pixel
    for face, roi in zip(faces, rois, strict=True):
        if roi is None:
            continue
        size = face.restored.shape[0]
        grid = _grid(_forward(face.inverse), roi, size, dev)
        crop = _soften(face.restored.to(dev)) if face.soften else face.restored.to(dev)
        pixels = F.grid_sample(crop.permute(2, 0, 1).unsqueeze(0).float(), grid, mode="bilinear",
                               padding_mode="border", align_corners=True)[0].permute(1, 2, 0)
        mask = _device_mask(face.mask, dev)
        m = F.grid_sample(mask[None, None], grid, mode="bilinear", padding_mode="zeros",
                          align_corners=True)[0, 0] * strength
        x0, y0, x1, y1 = roi[0] - ux0, roi[1] - uy0, roi[2] - ux0, roi[3] - uy0
        prev = best[y0:y1, x0:x1]
        win = m > prev
        b = bg[y0:y1, x0:x1]
        blended = (b + m[..., None] * (pixels - b)).round_().clamp_(0, 255)
        region = canvas[y0:y1, x0:x1]
        region.copy_(torch.where(win[..., None], blended, region))
        torch.maximum(prev, m, out=prev)
    result = canvas.to(torch.uint8).cpu().numpy()
    out[uy0:uy1, ux0:ux1] = result
    return out


def _paste_triton(src: torch.Tensor, kept: list[tuple[DeviceFace, tuple[int, int, int, int]]],
                  origin: tuple[int, int], strength: float, dev: torch.device) -> torch.Tensor:
    """The union box pasted by one kernel: crops stacked, masks shared when they are one array, and each face's
    image->crop affine moved to box coordinates (in float64 before the float32 cast)."""
    ux0, uy0 = origin
    on_dev = [f.restored if f.restored.device == dev else f.restored.to(dev) for f, _ in kept]
    soft = [i for i, (f, _) in enumerate(kept) if f.soften]
    if soft:                                   # the small faces softened together: ~12 torch calls, not per face
        # (one at a time measured 536.8 vs 587.5 / 567.3 faces/s, 20261201-064223)
        softened = _soften(torch.stack([on_dev[i] for i in soft]))
        for j, i in enumerate(soft):
            on_dev[i] = softened[j]
    crops = torch.stack(on_dev)
    masks = [f.mask for f, _ in kept]
    if all(m is masks[0] for m in masks):
        mask = _device_mask(masks[0], dev)[None]
    else:
        mask = torch.stack([_device_mask(m, dev) for m in masks])
    coefs = np.empty((len(kept), 6), np.float64)
    rois = np.empty((len(kept), 4), np.int32)
    for i, (face, roi) in enumerate(kept):
        a = _forward(face.inverse)
        coefs[i] = [a[0, 0], a[0, 1], a[0, 0] * ux0 + a[0, 1] * uy0 + a[0, 2],
                    a[1, 0], a[1, 1], a[1, 0] * ux0 + a[1, 1] * uy0 + a[1, 2]]
        rois[i] = [roi[0] - ux0, roi[1] - uy0, roi[2] - ux0, roi[3] - uy0]
    return paste_triton.paste_union(src, crops, mask, to_device_async(coefs.astype(np.float32), dev),
                                    to_device_async(rois, dev), strength)


_masks: dict[tuple[int, str], tuple[object, torch.Tensor]] = {}
_masks_lock = threading.Lock()


def _device_mask(mask: np.ndarray | torch.Tensor, dev: torch.device) -> torch.Tensor:
    """A paste mask as float32 on `dev`; read-only host masks (face_mask's cached ones) are uploaded once per
    device, not once per face (a pageable upload blocks the calling thread)."""
    if isinstance(mask, torch.Tensor):
        return mask.to(dev).float()
    if mask.flags.writeable:
        return torch.from_numpy(np.array(mask, np.float32)).to(dev)
    key = (id(mask), str(dev))
    with _masks_lock:
        hit = _masks.get(key)
        if hit is None or hit[0] is not mask:
            hit = _masks[key] = (mask, torch.from_numpy(np.array(mask, np.float32)).to(dev))
        return hit[1]
