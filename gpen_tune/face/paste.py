"""Paste restored faces back: soft mask, inverse warp inside each face's own region, seamless compositing.

Two homes for one rule: `paste_faces` on the host (OpenCV, any bit depth) and `paste_faces_device` on a torch
device (the restored crops stay where the generator wrote them; `gpen_tune.ops.paste` does the union box of an
image's faces in one Triton kernel or its PyTorch twin). `paste_faces_full_frame` is the upstream-like
full-frame paste, kept only as the `--no-face-crop` comparison.

Per face, only the rectangle covered by the inverse-warped crop is touched: the crop and its mask are warped into
that region with a shifted affine (never a full-frame warp or a full-frame mask per face, which is what makes
upstream's paste cost grow with the photo).

The blend rule (every implementation): with m_i the warped mask of face i, s the strength and bg the input,

    out = bg + s * sum_i m_i * (face_i - bg) / max(1, sum_i m_i)

A lone face blends by its mask as upstream does; where faces overlap, each contributes in proportion to its mask,
so the result changes smoothly across the overlap (upstream's "larger mask wins" switches faces along a hard
line). The weights are continuous wherever the masks are, and the masks fall to zero inside each region.
Pixels outside every mask keep their input values exactly.

The feather (border cleared, then two Gaussian blurs) is upstream's, scaled with the crop size, but never narrower
than MIN_FEATHER_SIGMA_PX in the image: a face of ~35 px is pasted from a crop shrunk ~6 times, where upstream's
feather becomes a one-pixel square edge.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from gpen_tune.face.align import apply_affine, invert_affine
from gpen_tune.ops.paste import paste_union
from gpen_tune.ops.transfer import thread_stream, to_device_async

REF_SIZE = 512               # upstream's mask numbers are for a 512 crop; they scale with the crop size
BORDER_AT_512 = 26           # px cleared on each side (upstream GPEN's paste mask)
SIGMA_AT_512 = 4.0           # two Gaussian blurs of this sigma (kernel 101 at 512)
KSIZE_AT_512 = 101
BORDER_SIGMAS = BORDER_AT_512 / (SIGMA_AT_512 * math.sqrt(2.0))   # cleared border in effective sigmas (~4.6)
MIN_FEATHER_SIGMA_PX = 2.5   # the feather's effective sigma in image pixels is never smaller than this
SMALL_FACE_PX = 100          # upstream softens restored faces whose detection box is smaller than this
SMOOTH_KERNEL = np.outer([1.0, 2.0, 1.0], [1.0, 2.0, 1.0]).astype(np.float32) / 16.0


@dataclass
class PasteFace:
    """One restored face ready to paste: crop [S, S, 3] uint8 RGB, inverse affine (crop -> image), optional mask."""

    restored: np.ndarray
    inverse: np.ndarray
    mask: np.ndarray | None = None       # [S, S] float32 in [0, 1]; None = `default_mask(S, inverse)`


def image_scale(inverse: np.ndarray) -> float:
    """Image pixels per crop pixel of an inverse affine (crop -> image)."""
    return math.sqrt(abs(float(np.linalg.det(np.asarray(inverse, np.float64)[:, :2]))))


def feather_sigma(size: int, inverse: np.ndarray | None = None) -> float:
    """Sigma (crop pixels) of each of the feather's two blurs for an SxS crop pasted through `inverse`: upstream's
    4 px at 512 scaled with the crop, widened so that the feather spans at least MIN_FEATHER_SIGMA_PX in the image
    (quantised to 1/4 px so that masks can be cached; at most size/26, which keeps the mask's core)."""
    default = SIGMA_AT_512 * size / REF_SIZE
    if inverse is None:
        return default
    need = MIN_FEATHER_SIGMA_PX / max(image_scale(inverse), 1e-6) / math.sqrt(2.0)
    if need <= default:
        return default
    return max(default, min(math.ceil(need * 4.0) / 4.0, size / 26.0))


def feather_params(size: int, sigma: float | None = None) -> tuple[int, float, int]:
    """(cleared border px, blur sigma, blur kernel size) of the feather of an SxS mask: upstream's numbers scaled
    with the size, or widened to `sigma` (crop px, from `feather_sigma`) with the border grown so that the mask
    still ends at zero. The one definition the host feather and the parser's device feather share."""
    k = size / REF_SIZE
    border = max(1, round(BORDER_AT_512 * k))
    ksize = max(3, int(round(KSIZE_AT_512 * k)) | 1)
    default = SIGMA_AT_512 * k
    if sigma is None or sigma <= default:
        return border, default, ksize
    return (max(border, math.ceil(BORDER_SIGMAS * sigma * math.sqrt(2.0))), float(sigma),
            max(ksize, 2 * math.ceil(4.0 * sigma) + 1))


def feather(mask: np.ndarray, sigma: float | None = None) -> np.ndarray:
    """Upstream's mask post-processing scaled to the crop size: clear the border, then blur twice (`sigma`:
    widened, see `feather_params`)."""
    border, sigma, ksize = feather_params(mask.shape[0], sigma)
    out = np.array(mask, dtype=np.float32)
    out[:border] = 0
    out[-border:] = 0
    out[:, :border] = 0
    out[:, -border:] = 0
    for _ in range(2):
        out = cv2.GaussianBlur(out, (ksize, ksize), sigma)
    return out


@lru_cache(maxsize=64)
def face_mask(size: int, sigma: float | None = None) -> np.ndarray:
    """The default paste mask of an SxS crop: a feathered square (read-only, cached per feather width)."""
    m = feather(np.ones((size, size), np.float32), sigma)
    m.setflags(write=False)
    return m


def default_mask(size: int, inverse: np.ndarray) -> np.ndarray:
    """The feathered square for a crop pasted through `inverse` (its feather widened for small faces)."""
    return face_mask(size, feather_sigma(size, inverse))


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


def _warped_masks(faces: Sequence[PasteFace | DeviceFace], width: int, height: int):
    """(face, roi, shifted inverse, warped mask [h, w] float32) of every face whose region meets the image."""
    for face in faces:
        size = face.restored.shape[0]
        roi = paste_region(face.inverse, size, width, height)
        if roi is None:
            continue
        x0, y0, x1, y1 = roi
        shift = _shifted(face.inverse, x0, y0)
        mask = default_mask(size, face.inverse) if face.mask is None else face.mask
        if isinstance(mask, torch.Tensor):                     # a DeviceFace's mask (blend_weights of a GPU paste)
            mask = mask.detach().float().cpu().numpy()
        m = cv2.warpAffine(np.asarray(mask, np.float32), shift, (x1 - x0, y1 - y0), flags=cv2.INTER_LINEAR,
                           borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
        yield face, roi, shift, m


def _union(rois: Sequence[tuple[int, int, int, int]]) -> tuple[int, int, int, int]:
    return min(r[0] for r in rois), min(r[1] for r in rois), max(r[2] for r in rois), max(r[3] for r in rois)


def _meets(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def overlapping_groups(rois: Sequence[tuple[int, int, int, int]]) -> list[list[int]]:
    """The indices of `rois` in groups whose rectangles meet, directly or through others of the group: no mask of
    one group reaches a region of another, so each group blends on its own."""
    parent = list(range(len(rois)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(rois)):
        for j in range(i):
            if _meets(rois[i], rois[j]):
                parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(rois)):
        groups.setdefault(root(i), []).append(i)
    return list(groups.values())


def paste_faces(base: np.ndarray, faces: list[PasteFace], strength: float = 1.0) -> np.ndarray:
    """A copy of `base` [H, W, 3] (uint8 or uint16) with every face blended in by `strength` in [0, 1] (the
    normalised rule of the module docstring). The sums run over each group of overlapping regions' own box, never
    the frame: faces spread over a large photo cost their regions, not the box around all of them."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    strength = min(float(strength), 1.0)
    scale, _ = _value_scale(base.dtype)                       # an unsupported base fails here, faces or not
    h, w = base.shape[:2]
    placed = list(_warped_masks(faces, w, h))
    for group in overlapping_groups([roi for _, roi, _, _ in placed]):
        _blend_group(out, base, [placed[i] for i in group], strength, scale)
    return out


def _blend_group(out: np.ndarray, base: np.ndarray, placed: list, strength: float, scale: float) -> None:
    """Blend one group of overlapping faces (`_warped_masks` items) into `out`, region by region; `scale`: the
    restored faces' values to the base's range (`_value_scale`)."""
    if len(placed) == 1:                     # most groups: the sums of one face are its own terms, bit for bit
        face, (x0, y0, x1, y1), shift, m = placed[0]
        bg = base[y0:y1, x0:x1].astype(np.float32)
        acc = m[..., None] * (_warped_face(face, shift, x1 - x0, y1 - y0, scale) - bg)
        out[y0:y1, x0:x1] = _rounded(bg, acc * (np.float32(strength) / np.maximum(m, np.float32(1.0)))[..., None],
                                     base.dtype)
        return
    ux0, uy0, ux1, uy1 = _union([roi for _, roi, _, _ in placed])
    total = np.zeros((uy1 - uy0, ux1 - ux0), np.float32)
    acc = np.zeros((uy1 - uy0, ux1 - ux0, 3), np.float32)
    for face, (x0, y0, x1, y1), shift, m in placed:
        bg = base[y0:y1, x0:x1].astype(np.float32)
        total[y0 - uy0:y1 - uy0, x0 - ux0:x1 - ux0] += m
        acc[y0 - uy0:y1 - uy0, x0 - ux0:x1 - ux0] += m[..., None] * (_warped_face(face, shift, x1 - x0, y1 - y0,
                                                                                  scale) - bg)
    bg = base[uy0:uy1, ux0:ux1].astype(np.float32)
    blended = _rounded(bg, acc * (np.float32(strength) / np.maximum(total, np.float32(1.0)))[..., None], base.dtype)
    # each region whole: where no mask reaches, acc is (+-)0 and the blend is bg exactly, so those pixels keep
    # their values (selecting the touched pixels by a boolean mask cost half the paste); pixels of the box
    # outside every region of the group may belong to another group's region and are not written
    for _, (x0, y0, x1, y1), _, _ in placed:
        out[y0:y1, x0:x1] = blended[y0 - uy0:y1 - uy0, x0 - ux0:x1 - ux0]


def _warped_face(face: PasteFace | DeviceFace, shift: np.ndarray, w: int, h: int, scale: float) -> np.ndarray:
    """The restored crop warped into its region [h, w, 3] float32, in the base's value range."""
    pixels = cv2.warpAffine(face.restored.astype(np.float32), shift, (w, h), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REPLICATE)
    return pixels if scale == 1.0 else pixels * np.float32(scale)


def _rounded(bg: np.ndarray, delta: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """bg + delta rounded half to even and saturated to `dtype` (uint8 / uint16): one OpenCV call, the same values
    as numpy's add, rint, clip and cast (each of those gave the GIL up and waited to take it back)."""
    return cv2.add(bg, delta, dtype=cv2.CV_8U if dtype == np.uint8 else cv2.CV_16U)


def blend_weights(shape: tuple[int, int], faces: Sequence[PasteFace | DeviceFace], strength: float = 1.0,
                  per_face: bool = False) -> np.ndarray:
    """The paste's final blend weights for an image of `shape` (H, W): [H, W] float32, the share of restored
    pixels at each pixel (s * min(1, sum_i m_i)); with per_face, [F, H, W], face i's share s * m_i / max(1, sum).
    For checking seams (`--save-mask`) and for the tests."""
    h, w = shape[:2]
    strength = min(max(float(strength), 0.0), 1.0)
    total = np.zeros((h, w), np.float32)
    placed = list(_warped_masks(faces, w, h))
    for _, (x0, y0, x1, y1), _, m in placed:
        total[y0:y1, x0:x1] += m
    ratio = np.float32(strength) / np.maximum(total, np.float32(1.0))
    if not per_face:
        return total * ratio
    shares = np.zeros((len(faces), h, w), np.float32)
    index = {id(f): i for i, f in enumerate(faces)}
    for face, (x0, y0, x1, y1), _, m in placed:
        shares[index[id(face)], y0:y1, x0:x1] = m * ratio[y0:y1, x0:x1]
    return shares


def paste_faces_full_frame(base: np.ndarray, faces: list[PasteFace], strength: float = 1.0) -> np.ndarray:
    """Upstream-like paste (full-frame warp and full-frame mask per face), kept only for comparison benchmarks;
    the same normalised blend as `paste_faces`."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    scale, top = _value_scale(base.dtype)
    h, w = base.shape[:2]
    total = np.zeros((h, w), np.float32)
    acc = np.zeros((h, w, 3), np.float32)
    bg = base.astype(np.float32)
    for face in faces:
        size = face.restored.shape[0]
        mask = default_mask(size, face.inverse) if face.mask is None else face.mask
        m = cv2.warpAffine(np.asarray(mask, np.float32), face.inverse, (w, h), flags=cv2.INTER_LINEAR)
        px = cv2.warpAffine(face.restored.astype(np.float32), face.inverse, (w, h), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REPLICATE)
        total += m
        acc += m[..., None] * (px * np.float32(scale) - bg)
    blended = bg + acc * (np.float32(min(strength, 1.0)) / np.maximum(total, np.float32(1.0)))[..., None]
    touched = total > 0
    out[touched] = np.clip(np.rint(blended[touched]), 0, top).astype(base.dtype)
    return out


# ---------------------------------------------------------------------------------------------- on a device

SMOOTH = torch.from_numpy(SMOOTH_KERNEL)


@dataclass
class DeviceFace:
    """One restored face on the device: crop [S,S,3] uint8 RGB, inverse affine crop->image (2x3), mask [S,S]."""

    restored: torch.Tensor
    inverse: np.ndarray
    mask: np.ndarray | torch.Tensor          # [S,S] float32 (`default_mask(S, inverse)` or a parse mask)
    soften: bool = False       # the host path's 3x3 smoothing of small faces


def soften_device(face: torch.Tensor) -> torch.Tensor:
    """[S,S,3] or [k,S,S,3] uint8 -> the same 3x3 smoothing as `soften` (reflect-101 border), rounded back to
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


@torch.inference_mode()
def paste_faces_device(base: np.ndarray, faces: Sequence[DeviceFace], strength: float = 1.0,
                       device: torch.device | str | None = None, base_device: torch.Tensor | None = None,
                       impl: str = "auto") -> np.ndarray:
    """A copy of `base` [H,W,3] uint8 with the faces pasted, computed on `device` (default: the faces' device).

    Same rectangles and blend rule as `paste_faces`; sampling positions are float32 where the host path
    quantises them to 1/32 px, so the two agree within 2 grey levels. `base_device`: the same pixels already on
    that device (the runner uploaded them to cut the faces), read instead of uploading the faces' union box.
    `impl`: the `gpen_tune.ops.paste` implementation ("auto" | "triton" | "torch")."""
    out = base.copy()
    if strength <= 0 or not faces:
        return out
    if base.dtype != np.uint8:
        raise ValueError("device paste handles uint8 images; use the host paste for 16-bit images")
    strength = min(float(strength), 1.0)
    dev = torch.device(device) if device is not None else faces[0].restored.device
    h, w = base.shape[:2]
    rois = [paste_region(f.inverse, f.restored.shape[0], w, h) for f in faces]
    kept = [(f, r) for f, r in zip(faces, rois, strict=True) if r is not None]
    if not kept:
        return out
    ux0, uy0 = min(r[0] for _, r in kept), min(r[1] for _, r in kept)
    ux1, uy1 = max(r[2] for _, r in kept), max(r[3] for _, r in kept)
    if base_device is not None and base_device.device == dev:
        src = base_device[uy0:uy1, ux0:ux1].contiguous()
    else:
        src = torch.from_numpy(np.ascontiguousarray(base[uy0:uy1, ux0:ux1]))
        if dev.type == "cuda":
            src = src.pin_memory()
        src = src.to(dev, non_blocking=True)                                # [h,w,3] input pixels, uint8
    crops, masks = _stack_faces(kept, dev)
    coefs = np.empty((len(kept), 6), np.float64)
    boxes = np.empty((len(kept), 4), np.int32)
    for i, (face, roi) in enumerate(kept):
        a = invert_affine(np.asarray(face.inverse, np.float64))            # image -> crop, moved to the box
        coefs[i] = [a[0, 0], a[0, 1], a[0, 0] * ux0 + a[0, 1] * uy0 + a[0, 2],
                    a[1, 0], a[1, 1], a[1, 0] * ux0 + a[1, 1] * uy0 + a[1, 2]]
        boxes[i] = [roi[0] - ux0, roi[1] - uy0, roi[2] - ux0, roi[3] - uy0]
    pasted = paste_union(src, crops, masks, to_device_async(coefs.astype(np.float32), dev),
                         to_device_async(boxes, dev), strength, impl=impl)
    out[uy0:uy1, ux0:ux1] = pasted.cpu().numpy()
    return out


def _stack_faces(kept: list[tuple[DeviceFace, tuple[int, int, int, int]]], dev: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """[F,S,S,3] crops on `dev` (small faces softened together: ~12 torch calls, not a dozen per face) and the
    masks, one shared [1,S,S] when every face uses the same array."""
    on_dev = [f.restored if f.restored.device == dev else f.restored.to(dev) for f, _ in kept]
    if len({t.shape for t in on_dev}) != 1:
        raise ValueError("device paste needs crops of one size per image")
    soft = [i for i, (f, _) in enumerate(kept) if f.soften]
    if soft:
        softened = soften_device(torch.stack([on_dev[i] for i in soft]))
        for j, i in enumerate(soft):
            on_dev[i] = softened[j]
    masks = [f.mask for f, _ in kept]
    if all(m is masks[0] for m in masks):
        mask = _device_mask(masks[0], dev)[None]
    else:
        mask = torch.stack([_device_mask(m, dev) for m in masks])
    return torch.stack(on_dev), mask


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


# ---------------------------------------------------------------------------------------------- one image


@dataclass
class RestoredFace:
    """What the paste of one image needs of a face: its restoration (host array, or device tensor for the device
    paste), crop -> output affine, mask (None: the feathered square) and whether it is a small face to soften."""

    restored: np.ndarray | torch.Tensor
    inverse: np.ndarray
    mask: np.ndarray | torch.Tensor | None = None
    small: bool = False


def paste_image(base: np.ndarray, faces: Sequence[RestoredFace], strength: float, *, on_device: bool = False,
                base_device: torch.Tensor | None = None, full_frame: bool = False, impl: str = "auto",
                want_weights: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The one paste of an image's restored faces: on the host (`paste_faces`, or the full-frame comparison
    paste), or on the faces' device (`paste_faces_device`, its kernel in `gpen_tune.ops.paste`) on a stream off
    the generator's with one synchronisation. Returns (pixels, the blend weights when `want_weights`)."""
    if not on_device:
        host = [PasteFace(soften(f.restored) if f.small else f.restored, f.inverse, f.mask) for f in faces]
        weights = blend_weights(base.shape[:2], host, strength) if want_weights else None
        return (paste_faces_full_frame if full_frame else paste_faces)(base, host, strength), weights
    stream = thread_stream(faces[0].restored.device)
    with torch.cuda.stream(stream):
        device = [DeviceFace(f.restored, f.inverse,
                             default_mask(f.restored.shape[0], f.inverse) if f.mask is None else f.mask,
                             soften=f.small) for f in faces]
        weights = blend_weights(base.shape[:2], device, strength) if want_weights else None
        pixels = paste_faces_device(base, device, strength, base_device=base_device, impl=impl)
    stream.synchronize()
    return pixels, weights


def blend_aligned(base: np.ndarray, restored: np.ndarray, strength: float) -> np.ndarray:
    """An aligned input (the whole image is the face): the restored crop resized to the image and blended by
    `strength` (a 16-bit base gets the 8-bit face scaled by 257)."""
    h, w = base.shape[:2]
    size = restored.shape[0]
    if (w, h) != (size, size):
        restored = cv2.resize(restored, (w, h), interpolation=cv2.INTER_AREA if w < size else cv2.INTER_LINEAR)
    scale, top = _value_scale(base.dtype)
    bg = base.astype(np.float32)
    out = bg + strength * (restored.astype(np.float32) * scale - bg)
    return np.clip(np.rint(out), 0, top).astype(base.dtype)
