"""Paste restored faces back: soft mask, inverse warp inside each face's own region, seamless compositing.

Per face, only the rectangle covered by the inverse-warped crop is touched: the crop and its mask are warped into
that region with a shifted affine (never a full-frame warp or a full-frame mask per face, which is what makes
upstream's paste cost grow with the photo). Overlapping faces follow upstream's rule: at every pixel the face
with the larger mask wins. Pixels outside every mask keep their input values exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

from gpen_tune.face.align import apply_affine

REF_SIZE = 512               # upstream's mask numbers are for a 512 crop; they scale with the crop size
BORDER_AT_512 = 26           # px cleared on each side (facts 2.2 step 6)
SIGMA_AT_512 = 4.0           # two Gaussian blurs of this sigma (kernel 101 at 512)
KSIZE_AT_512 = 101
SMALL_FACE_PX = 100          # upstream softens restored faces whose detection box is smaller than this
SMOOTH_KERNEL = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]).astype(np.float32) / 16.0


@dataclass
class PasteFace:
    """One restored face ready to paste: crop [S, S, 3] uint8 RGB, inverse affine (crop -> image), optional mask."""

    restored: np.ndarray
    inverse: np.ndarray
    mask: np.ndarray | None = None       # [S, S] float32 in [0, 1]; None = the feathered square `face_mask(S)`


def feather(mask: np.ndarray) -> np.ndarray:
    """Upstream's mask post-processing scaled to the crop size: clear the border, then blur twice."""
    size = mask.shape[0]
    k = size / REF_SIZE
    border = max(1, round(BORDER_AT_512 * k))
    sigma = SIGMA_AT_512 * k
    ksize = max(3, int(round(KSIZE_AT_512 * k)) | 1)
    out = np.array(mask, dtype=np.float32)
    out[:border] = 0
    out[-border:] = 0
    out[:, :border] = 0
    out[:, -border:] = 0
    for _ in range(2):
        out = cv2.GaussianBlur(out, (ksize, ksize), sigma)
    return out


@lru_cache(maxsize=8)
def face_mask(size: int) -> np.ndarray:
    """The default paste mask of an SxS crop: a feathered square (read-only, cached)."""
    m = feather(np.ones((size, size), np.float32))
    m.setflags(write=False)
    return m


def soften(face: np.ndarray) -> np.ndarray:
    """Upstream's small-face softening: 3x3 [1,2,1]x[1,2,1]/16 filter on the restored crop."""
    return cv2.filter2D(face, -1, SMOOTH_KERNEL, borderType=cv2.BORDER_REFLECT_101)


def is_small_face(box: np.ndarray) -> bool:
    x1, y1, x2, y2 = box
    return min(x2 - x1, y2 - y1) < SMALL_FACE_PX


def paste_region(inverse: np.ndarray, size: int, width: int, height: int) -> tuple[int, int, int, int] | None:
    """Image rectangle (x0, y0, x1, y1) covered by the inverse-warped crop, clipped to the image; None if empty."""
    corners = apply_affine(inverse, np.array([[0, 0], [size, 0], [0, size], [size, size]], dtype=np.float64))
    x0 = max(0, int(np.floor(corners[:, 0].min())) - 1)
    y0 = max(0, int(np.floor(corners[:, 1].min())) - 1)
    x1 = min(width, int(np.ceil(corners[:, 0].max())) + 2)
    y1 = min(height, int(np.ceil(corners[:, 1].max())) + 2)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def _shifted(inverse: np.ndarray, x0: int, y0: int) -> np.ndarray:
    m = np.array(inverse, dtype=np.float64)
    m[:, 2] -= (x0, y0)
    return m


def _value_scale(dtype: np.dtype) -> tuple[float, int]:
    """Restored faces are 8-bit; a 16-bit base gets them scaled by 257 so untouched pixels keep all 16 bits."""
    if dtype == np.uint16:
        return 257.0, 65535
    if dtype == np.uint8:
        return 1.0, 255
    raise ValueError(f"paste base must be uint8 or uint16, got {dtype}")


def paste_faces(base: np.ndarray, faces: list[PasteFace], strength: float = 1.0) -> np.ndarray:
    """A copy of `base` [H, W, 3] (uint8 or uint16) with every face blended in by `strength` in [0, 1]."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    strength = min(float(strength), 1.0)
    scale, top = _value_scale(base.dtype)
    h, w = base.shape[:2]
    done: list[tuple[tuple[int, int, int, int], np.ndarray]] = []
    for face in faces:
        size = face.restored.shape[0]
        roi = paste_region(face.inverse, size, w, h)
        if roi is None:
            continue
        x0, y0, x1, y1 = roi
        shift = _shifted(face.inverse, x0, y0)
        mask = face_mask(size) if face.mask is None else face.mask
        m = cv2.warpAffine(mask, shift, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=0.0) * np.float32(strength)
        win = m > _previous_mask(done, roi)
        done.append((roi, m))
        if not win.any():
            continue
        pixels = cv2.warpAffine(face.restored.astype(np.float32), shift, (x1 - x0, y1 - y0),
                                flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        bg = base[y0:y1, x0:x1].astype(np.float32)
        mw = m[win][:, None]
        blended = bg[win] + mw * (pixels[win] * np.float32(scale) - bg[win])
        out[y0:y1, x0:x1][win] = np.clip(np.rint(blended), 0, top).astype(base.dtype)
    return out


def _previous_mask(done, roi) -> np.ndarray:
    """Largest mask value of the faces pasted so far, inside `roi` (zeros where none overlaps)."""
    x0, y0, x1, y1 = roi
    prev = np.zeros((y1 - y0, x1 - x0), np.float32)
    for (a0, b0, a1, b1), m in done:
        ix0, iy0, ix1, iy1 = max(x0, a0), max(y0, b0), min(x1, a1), min(y1, b1)
        if ix1 <= ix0 or iy1 <= iy0:
            continue
        dst = prev[iy0 - y0:iy1 - y0, ix0 - x0:ix1 - x0]
        np.maximum(dst, m[iy0 - b0:iy1 - b0, ix0 - a0:ix1 - a0], out=dst)
    return prev


def paste_faces_full_frame(base: np.ndarray, faces: list[PasteFace], strength: float = 1.0) -> np.ndarray:
    """Upstream-like paste (full-frame warp and full-frame mask per face), kept only for comparison benchmarks."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    scale, top = _value_scale(base.dtype)
    h, w = base.shape[:2]
    full_mask = np.zeros((h, w), np.float32)
    full_img = np.zeros((h, w, 3), np.float32)
    for face in faces:
        size = face.restored.shape[0]
        mask = face_mask(size) if face.mask is None else face.mask
        m = cv2.warpAffine(mask, face.inverse, (w, h), flags=cv2.INTER_LINEAR) * np.float32(min(strength, 1.0))
        px = cv2.warpAffine(face.restored.astype(np.float32), face.inverse, (w, h), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REPLICATE)
        win = m > full_mask
        full_mask = np.where(win, m, full_mask)
        full_img = np.where(win[..., None], px * np.float32(scale), full_img)
    bg = base.astype(np.float32)
    blended = bg + full_mask[..., None] * (full_img - bg)
    touched = full_mask > 0
    out[touched] = np.clip(np.rint(blended[touched]), 0, top).astype(base.dtype)
    return out
