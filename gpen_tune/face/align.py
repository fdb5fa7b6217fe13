"""Alignment: 5-point templates, Umeyama similarity, fixed-point bilinear crop and its exact inverse."""

from __future__ import annotations

import cv2
import numpy as np
import torch

from gpen_tune.choices import TEMPLATES
from gpen_tune.ops.warp_crop import warp_crops

# Classic 96x112 five-point set (x, y) that upstream GPEN pads to its template.
_BASE_96x112 = np.array([
    [30.2946, 51.6963], [65.5318, 51.5014], [48.0252, 71.7366], [33.5493, 92.3655], [62.7299, 92.2041],
])
# FFHQ 5 points for a 512 crop, as used by facexlib's FaceRestoreHelper (GFPGAN, CodeFormer, facefusion's GPEN).
_FFHQ_512 = np.array([
    [192.98138, 239.94708], [318.90277, 240.19360], [256.63416, 314.01935],
    [201.26117, 371.41043], [313.08905, 371.15118],
])


def gpen_template(size: int) -> np.ndarray:
    """GPEN's template for an SxS crop: square the 96x112 set (+8 in x), pad by 0.25 each side (+28), scale S/168."""
    return (_BASE_96x112 + np.array([36.0, 28.0])) * (size / 168.0)


def ffhq_template(size: int) -> np.ndarray:
    return _FFHQ_512 * (size / 512.0)


def template(name: str, size: int) -> np.ndarray:
    """The 5 reference points [5, 2] of template `name` for an SxS crop."""
    if name == "gpen":
        return gpen_template(size)
    if name == "ffhq":
        return ffhq_template(size)
    raise ValueError(f"unknown template {name!r}; choose one of: {', '.join(TEMPLATES)}")


def umeyama(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) mapping src [N, 2] onto dst [N, 2].

    Umeyama 1991 (eq. 40-43) without a reflection. In 2-D its optimum has a closed form: with points as complex
    numbers, scale * rotation = sum(conj(s) * d) / sum(|s|^2) over the centred points; equal to the SVD route to
    1e-12 (tested) at a third of the Python cost, which a folder run pays once per face. Returns a 3x3 matrix.
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    s0, d0 = src - mu_s, dst - mu_d
    var_s = float((s0 * s0).sum())
    if var_s > 0:
        a = float((s0 * d0).sum()) / var_s                                        # scale * cos
        b = float((s0[:, 0] * d0[:, 1] - s0[:, 1] * d0[:, 0]).sum()) / var_s      # scale * sin
    else:
        a, b = 1.0, 0.0
    m = np.array([[a, -b, 0.0], [b, a, 0.0], [0.0, 0.0, 1.0]])
    m[:2, 2] = mu_d - m[:2, :2] @ mu_s
    return m


def invert_affine(m: np.ndarray) -> np.ndarray:
    """Exact inverse of a 2x3 affine matrix."""
    full = np.vstack([m, [0.0, 0.0, 1.0]])
    return np.linalg.inv(full)[:2]


def alignment(landmarks: np.ndarray, size: int, template_name: str = "gpen") -> tuple[np.ndarray, np.ndarray]:
    """(affine image->crop, inverse crop->image), both 2x3, that put `landmarks` onto the template."""
    m = umeyama(landmarks, template(template_name, size))[:2]
    return m, invert_affine(m)


def apply_affine(m: np.ndarray, points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    return points @ m[:, :2].T + m[:, 2]


# Crop sampling positions are fixed point in 1/32 px (OpenCV's INTER_BITS, the precision of its remap tables).
SUBPIXEL_BITS = 5
SUBPIXEL = 1 << SUBPIXEL_BITS


def crop_tables(affine: np.ndarray, size: int) -> np.ndarray:
    """[4, S] int32 source positions of an SxS crop in 1/32 px, separable in the crop's column c and row r:
    x = t[0][c] + t[1][r], y = t[2][c] + t[3][r] (each term rounded half to even from float64).

    The crop is defined by these integers rather than by cv2.warpAffine, whose OpenCV 5 version interpolates in
    float32 along SIMD-width-dependent paths: the CPU (`warp_crop`) and the GPU (`cut_faces_device`) both read
    the same tables and do the same integer bilinear, so their crops are the same bits."""
    inv = invert_affine(np.asarray(affine, dtype=np.float64))
    s = np.arange(size, dtype=np.float64)
    return np.stack([
        np.rint(inv[0, 0] * s * SUBPIXEL), np.rint((inv[0, 1] * s + inv[0, 2]) * SUBPIXEL),
        np.rint(inv[1, 0] * s * SUBPIXEL), np.rint((inv[1, 1] * s + inv[1, 2]) * SUBPIXEL),
    ]).astype(np.int32)


def warp_crop(image: np.ndarray, affine: np.ndarray, size: int) -> np.ndarray:
    """SxS bilinear crop at the fixed-point positions of `crop_tables`, through OpenCV's integer remap (weights
    (32 - fx)(32 - fy) ... in 1/1024, rounded half up). Border pixels are replicated, so a face at the image edge
    does not bleed black into the restored crop (and back into the image through the paste's interpolation)."""
    whole, frac = remap_tables(crop_tables(affine, size))
    return cv2.remap(image, whole, frac, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


FLOAT_EXACT_TABLE = 1 << 23      # |table entries| below this: the entries / 32 and their sums are exact in float32


def remap_tables(t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """OpenCV's fixed-point remap maps of `crop_tables` t: whole pixels [S, S, 2] int16 (saturated, as OpenCV does)
    and fractions [S, S] uint16 (fy * 32 + fx). Built by `cv2.convertMaps` from float32 maps where those hold the
    positions exactly (every real face: 4x cheaper than integer numpy), else in int32."""
    if int(np.abs(t).max()) < FLOAT_EXACT_TABLE:
        f = t.astype(np.float32) / np.float32(SUBPIXEL)              # multiples of 1/32, exact
        return cv2.convertMaps(np.add.outer(f[1], f[0]), np.add.outer(f[3], f[2]), cv2.CV_16SC2)
    x = t[1][:, None].astype(np.int64) + t[0][None, :]
    y = t[3][:, None].astype(np.int64) + t[2][None, :]
    whole = np.stack([np.clip(x >> SUBPIXEL_BITS, -32768, 32767), np.clip(y >> SUBPIXEL_BITS, -32768, 32767)],
                     -1).astype(np.int16)
    frac = ((y & (SUBPIXEL - 1)) << SUBPIXEL_BITS | (x & (SUBPIXEL - 1))).astype(np.uint16)
    return whole, frac


def face_tables(affines: list[np.ndarray], size: int) -> np.ndarray:
    """[F, 4, S] int32: `crop_tables` of each face (the device crop's input)."""
    return np.stack([crop_tables(a, size) for a in affines]) if affines else np.zeros((0, 4, size), np.int32)


def cut_faces(image: np.ndarray, affines: list[np.ndarray], size: int) -> list[np.ndarray]:
    """The SxS crops [S, S, 3] uint8 of every face of `image` on the host (`warp_crop` each)."""
    return [warp_crop(image, a, size) for a in affines]


def cut_faces_device(image: torch.Tensor, affines: list[np.ndarray], size: int, impl: str = "auto") -> torch.Tensor:
    """[F, S, S, 3] uint8 crops of an image already on a device ([H, W, 3] uint8), on the current stream: the same
    bits as `cut_faces` (`gpen_tune.ops.warp_crop`, a Triton kernel or its PyTorch twin)."""
    tables = torch.from_numpy(face_tables(affines, size))
    if image.device.type == "cuda":
        tables = tables.pin_memory().to(image.device, non_blocking=True)
    return warp_crops(image, tables.to(image.device), impl=impl)
