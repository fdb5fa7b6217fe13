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

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

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
    """[S,S,3] uint8 -> the same 3x3 smoothing as the CPU path (reflect-101 border), rounded back to uint8."""
    x = face.permute(2, 0, 1).unsqueeze(1).float()                       # [3,1,S,S]
    x = F.pad(x, (1, 1, 1, 1), mode="reflect")
    y = F.conv2d(x, SMOOTH.to(x.device).view(1, 1, 3, 3))
    return y.round().clamp(0, 255).to(torch.uint8).squeeze(1).permute(1, 2, 0)


@torch.inference_mode()
def paste_faces_device(base: np.ndarray, faces: Sequence[DeviceFace], strength: float = 1.0,
                       device: torch.device | str | None = None) -> np.ndarray:
    """A copy of `base` [H,W,3] uint8 with the faces pasted, computed on `device` (default: the faces' device)."""
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
    src = torch.from_numpy(np.ascontiguousarray(base[uy0:uy1, ux0:ux1]))
    if dev.type == "cuda":
        src = src.pin_memory()
    bg = src.to(dev, non_blocking=True).float()                             # [h,w,3] input pixels
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
        mask = face.mask if isinstance(face.mask, torch.Tensor) else torch.from_numpy(np.array(face.mask, np.float32))
        mask = mask.to(dev).float()
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
