"""The paste's blend rule: overlapping faces blend by their normalised masks (no hard edge where one face's region
meets another's), the feather is wide enough in the image for small faces, and every implementation (host, the
PyTorch twin, the Triton kernel in its interpreter) follows the same rule. Real faces: the bundled photos in a
mosaic whose faces' paste regions overlap, and the Solvay photo with the offline MTCNN's detections."""

from __future__ import annotations

import math
from functools import cache

import cv2
import numpy as np
import pytest
import torch
from face_testdata import mtcnn, solvay_path

from gpen_tune.face import samples
from gpen_tune.face.align import alignment
from gpen_tune.face.check_images import CHECKER_GREYS, comparison_image, over_checkerboard, weights_image
from gpen_tune.face.paste import (
    MIN_FEATHER_SIGMA_PX,
    DeviceFace,
    PasteFace,
    blend_weights,
    default_mask,
    face_mask,
    image_scale,
    overlapping_groups,
    paste_faces,
    paste_faces_device,
    paste_faces_full_frame,
    paste_region,
)
from gpen_tune.imageio import Picture

SIZE = 256


def _inverse(cx: float, cy: float, scale: float, degrees: float) -> np.ndarray:
    """crop -> image affine putting the crop centre at (cx, cy), `scale` image px per crop px, rotated."""
    a = math.radians(degrees)
    c, s = math.cos(a) * scale, math.sin(a) * scale
    half = SIZE / 2
    return np.array([[c, -s, cx - (c * half - s * half)], [s, c, cy - (s * half + c * half)]])


@cache
def overlap_mosaic() -> tuple[np.ndarray, tuple[PasteFace, ...]]:
    """Real aligned faces (the bundled photos) laid out so that neighbouring paste regions overlap by a third to a
    half, at three scales (one small face: ~30 px). Restored stand-ins: each face brightened or darkened by 40
    levels, so that a hard switch between faces would show as a 40+ level edge."""
    crops = samples.aligned_face_crops(SIZE)
    layout = [(110, 150, 0.55, 4), (205, 140, 0.45, -9), (265, 175, 0.18, 3), (300, 120, 0.5, 0), (235, 230, 0.35, 7)]
    canvas = np.full((300, 420, 3), samples.BACKGROUND, np.uint8)
    faces = []
    for i, (cx, cy, scale, deg) in enumerate(layout):
        inv = _inverse(cx, cy, scale, deg)
        crop = crops[i % len(crops)]
        placed = cv2.warpAffine(crop, inv, (420, 300), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
        inside = cv2.warpAffine(np.ones((SIZE, SIZE), np.uint8), inv, (420, 300), flags=cv2.INTER_NEAREST) > 0
        canvas[inside] = placed[inside]
        shift = 40 if i % 2 else -40
        faces.append(PasteFace(np.clip(crop.astype(int) + shift, 0, 255).astype(np.uint8), inv))
    return canvas, tuple(faces)


def max_step(a: np.ndarray) -> float:
    """Largest difference between 4-neighbours of a map [..., H, W]."""
    return float(max(np.abs(np.diff(a, axis=-1)).max(), np.abs(np.diff(a, axis=-2)).max()))


def feather_step_bound(faces) -> float:
    """The steepest step of any single face's own weight map (its feather alone, no other face)."""
    return max(max_step(blend_weights((300, 420), [f])) for f in faces)


def test_overlapping_regions_really_overlap():
    _, faces = overlap_mosaic()
    alone = blend_weights((300, 420), faces, per_face=True) > 0
    assert (alone.sum(0) >= 2).sum() > 3000              # thousands of pixels under two or more faces


def test_blend_weights_have_no_jump_along_overlap_borders():
    _, faces = overlap_mosaic()
    shares = blend_weights((300, 420), faces, per_face=True)
    bound = feather_step_bound(faces)
    # a share m_i / max(1, sum m) moves at most (|dm_i| + |d sum m|) / 1 per pixel: three feathers' steps
    assert max_step(shares) <= 3 * bound
    # the rule it replaces: the largest mask takes the pixel, a jump from ~0.9 to 0 along the overlap
    masks = np.stack([blend_weights((300, 420), [f]) for f in faces])
    winner = np.where(masks == masks.max(0, keepdims=True), masks, 0.0)
    assert max_step(winner) > 3 * bound


def test_pixels_have_no_edge_where_faces_overlap():
    canvas, faces = overlap_mosaic()
    flat = [PasteFace(np.full((SIZE, SIZE, 3), 230 if i % 2 else 20, np.uint8), f.inverse)
            for i, f in enumerate(faces)]
    grey = np.full_like(canvas, 128)
    out = paste_faces(grey, flat).astype(float)
    bound = feather_step_bound(faces)
    assert max_step(out[..., 0]) <= 3 * bound * 210 + 2  # 210 = the largest colour difference in play
    assert out.max() > 200 and out.min() < 40            # both faces are there


def test_total_weight_is_strength_times_clipped_mask_sum():
    _, faces = overlap_mosaic()
    masks = np.stack([blend_weights((300, 420), [f]) for f in faces])
    total = blend_weights((300, 420), faces, strength=0.7)
    np.testing.assert_allclose(total, 0.7 * np.minimum(1.0, masks.sum(0)), atol=1e-5)
    shares = blend_weights((300, 420), faces, strength=0.7, per_face=True)
    np.testing.assert_allclose(shares.sum(0), total, atol=1e-5)


def test_lone_face_blends_by_its_mask_and_the_rest_is_untouched():
    canvas, faces = overlap_mosaic()
    face = faces[0]
    m = blend_weights(canvas.shape, [face], strength=0.8)
    restored = cv2.warpAffine(face.restored.astype(np.float32), face.inverse, (420, 300), flags=cv2.INTER_LINEAR,
                              borderMode=cv2.BORDER_REPLICATE)
    want = np.rint(canvas + m[..., None] * (restored - canvas))
    out = paste_faces(canvas, [face], 0.8)
    assert np.abs(out - want).max() <= 1
    everyone = paste_faces(canvas, list(faces))
    outside = blend_weights(canvas.shape, faces) == 0
    assert np.array_equal(everyone[outside], canvas[outside]) and outside.sum() > 10000


def test_a_face_inside_the_box_of_another_group_is_pasted_as_if_alone():
    """Faces blend group by group (regions that meet, through others too); a lone face sitting inside the box
    around a chain of faces is neither overwritten by nor mixed into the chain's blend, whichever comes first."""
    crops = samples.aligned_face_crops(SIZE)
    lone = (650, 110)                                                # inside the chain's box, meeting none of it
    chain = [(110, 110), (290, 290), (470, 470), (650, 650)]          # neighbours' regions overlap, ends do not
    faces = [PasteFace(crops[i % len(crops)][:, ::-1].copy(), _inverse(cx, cy, 0.8, 5))
             for i, (cx, cy) in enumerate([lone, *chain])]
    base = np.full((800, 800, 3), samples.BACKGROUND, np.uint8)
    rois = [paste_region(f.inverse, SIZE, 800, 800) for f in faces]
    assert overlapping_groups(rois) == [[0], [1, 2, 3, 4]]
    everyone = paste_faces(base, faces, 0.9)
    one_by_one = paste_faces(paste_faces(base, faces[1:], 0.9), faces[:1], 0.9)
    assert np.array_equal(everyone, one_by_one)
    x0, y0, x1, y1 = rois[0]
    assert (everyone[y0:y1, x0:x1] != base[y0:y1, x0:x1]).any(axis=2).mean() > 0.3   # the lone face is there


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_a_face_with_an_empty_mask_changes_no_pixel(dtype):
    """A lone face is blended on its own; joined by an overlapping face whose mask is zero everywhere it goes
    through the group's sums instead, and every pixel stays the same (8 and 16 bits)."""
    canvas, faces = overlap_mosaic()
    base = canvas.astype(dtype) * (257 if dtype == np.uint16 else 1)
    lone = faces[0]
    empty = PasteFace(faces[1].restored, lone.inverse @ np.diag([1.0, 1.0, 1.0]) + [[0, 0, 9], [0, 0, 5]],
                      np.zeros((SIZE, SIZE), np.float32))
    assert overlapping_groups([paste_region(f.inverse, SIZE, 420, 300) for f in (lone, empty)]) == [[0, 1]]
    for strength in (1.0, 0.55):
        alone = paste_faces(base, [lone], strength)
        assert np.array_equal(paste_faces(base, [lone, empty], strength), alone)
        assert (alone != base).any()


def test_full_frame_comparison_paste_follows_the_same_rule():
    canvas, faces = overlap_mosaic()
    assert np.abs(paste_faces_full_frame(canvas, list(faces), 0.9).astype(int) -
                  paste_faces(canvas, list(faces), 0.9)).max() <= 1


def test_sixteen_bit_base():
    canvas, faces = overlap_mosaic()
    out16 = paste_faces(canvas.astype(np.uint16) * 257, list(faces))
    out8 = paste_faces(canvas, list(faces))
    assert out16.dtype == np.uint16 and np.abs(out16 / 257.0 - out8).max() <= 1


@pytest.mark.parametrize("strength", [1.0, 0.6])
def test_host_and_pytorch_twin_agree_on_overlaps(strength):
    canvas, faces = overlap_mosaic()
    dev = [DeviceFace(torch.from_numpy(f.restored), f.inverse, default_mask(SIZE, f.inverse)) for f in faces]
    host = paste_faces(canvas, list(faces), strength).astype(int)
    twin = paste_faces_device(canvas, dev, strength, device="cpu", impl="torch").astype(int)
    assert np.abs(host - twin).max() <= 2
    assert np.abs(host - canvas).max() > 30


# ------------------------------------------------------------------------------------------- small faces


@cache
def solvay_faces():
    path = solvay_path()
    if path is None:
        pytest.skip("the Solvay photo is not in this checkout's shared data")
    img = cv2.imread(str(path))[..., ::-1].copy()
    dets = mtcnn().detect([img])[0]
    faces = []
    for d in dets:
        affine, inverse = alignment(d.landmarks, 512)
        crop = cv2.warpAffine(img, affine, (512, 512), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        faces.append(PasteFace(255 - crop, inverse))
    return img, faces


def test_solvay_small_faces_have_a_wide_feather_and_no_square_edge():
    img, faces = solvay_faces()
    assert len(faces) >= 25 and max(image_scale(f.inverse) for f in faces) < 0.2   # ~35 px faces, 512 crops
    gaussian_step = 1.0 / (MIN_FEATHER_SIGMA_PX * math.sqrt(2 * math.pi))         # steepest step of the feather
    for f in faces[:8]:
        own = blend_weights(img.shape, [f])
        assert max_step(own) <= 1.2 * gaussian_step
        upstream = blend_weights(img.shape, [PasteFace(f.restored, f.inverse, face_mask(512))])
        assert max_step(upstream) > 2 * gaussian_step            # the one-pixel square edge it replaces


def test_solvay_overlaps_blend_smoothly():
    img, faces = solvay_faces()
    shares = blend_weights(img.shape, faces, per_face=True)
    assert ((shares > 0).sum(0) >= 2).sum() > 500               # neighbours' regions do overlap in the photo
    assert max_step(shares) <= 3 * feather_step_bound_solvay(img, faces)
    out = paste_faces(img, faces)
    assert np.abs(out.astype(int) - img).max() > 100


def feather_step_bound_solvay(img, faces) -> float:
    return max(max_step(blend_weights(img.shape, [f])) for f in faces)


# ------------------------------------------------------------------------------------------- check images


def test_comparison_shows_alpha_over_a_checkerboard_at_the_output_size():
    rgb = samples.astronaut()[:64, :64]
    alpha = np.full((64, 64), 255, np.uint8)
    alpha[:, :32] = 0
    before = Picture(rgb, alpha)
    after = Picture(cv2.resize(rgb, (128, 128)), cv2.resize(alpha, (128, 128), interpolation=cv2.INTER_NEAREST))
    side = comparison_image(before, after)
    assert side.shape == (128, 256, 3)
    transparent = side[:, 128:128 + 60]
    assert set(np.unique(transparent)) <= set(CHECKER_GREYS) and len(np.unique(transparent)) == 2
    assert np.array_equal(side[:, 128 + 70:], after.rgb[:, 70:])
    assert np.array_equal(over_checkerboard(rgb, None), rgb)


def test_weights_image():
    _, faces = overlap_mosaic()
    img = weights_image(blend_weights((300, 420), faces))
    assert img.dtype == np.uint8 and img.max() == 255 and img.min() == 0


# ------------------------------------------------------------------------------------------- Triton kernel

_KERNEL = r"""
import json
import numpy as np, torch, cv2
import sys
sys.path[:0] = ["tests", "tests/face"]
from test_paste_blend import overlap_mosaic, SIZE
from gpen_tune.face.paste import DeviceFace, default_mask, paste_faces, paste_faces_device
from gpen_tune.ops import paste as op

canvas, faces = overlap_mosaic()
k = 0.35                                   # small: the interpreter runs every program of the kernel in numpy
small = cv2.resize(canvas, None, fx=k, fy=k, interpolation=cv2.INTER_AREA)
size = 48
from gpen_tune.face.paste import PasteFace
host_faces, dev_faces = [], []
for i, f in enumerate(faces):
    crop = cv2.resize(f.restored, (size, size), interpolation=cv2.INTER_AREA)
    inv = f.inverse * k * np.array([[SIZE / size, SIZE / size, 1.0]] * 2)
    inv[:, 2] += (k - 1) / 2
    host_faces.append(PasteFace(crop, inv))
    dev_faces.append(DeviceFace(torch.from_numpy(crop), inv, default_mask(size, inv)))
res = {"available": op.available(torch.device("cpu"))}
for strength in (1.0, 0.6):
    host = paste_faces(small, host_faces, strength).astype(int)
    twin = paste_faces_device(small, dev_faces, strength, device="cpu", impl="torch").astype(int)
    kern = paste_faces_device(small, dev_faces, strength, device="cpu", impl="triton").astype(int)
    res[str(strength)] = {"kernel_vs_twin": int(np.abs(kern - twin).max()),
                          "kernel_vs_host": int(np.abs(kern - host).max()),
                          "changed": int(np.abs(host - small).max())}
print("RESULT" + json.dumps(res))
"""


@pytest.mark.slow
def test_triton_kernel_follows_the_blend_rule_in_interpreter():
    from triton_interp import run_in_interpreter

    res = run_in_interpreter(_KERNEL)
    assert res["available"], res
    for strength in ("1.0", "0.6"):
        r = res[strength]
        assert r["changed"] > 30, res
        assert r["kernel_vs_twin"] <= 1 and r["kernel_vs_host"] <= 2, res


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strength", [1.0, 0.6])
def test_cuda_kernel_twin_and_host_agree_on_overlaps(strength):
    canvas, faces = overlap_mosaic()
    dev = [DeviceFace(torch.from_numpy(f.restored).cuda(), f.inverse, default_mask(SIZE, f.inverse)) for f in faces]
    host = paste_faces(canvas, list(faces), strength).astype(int)
    kernel = paste_faces_device(canvas, dev, strength, impl="triton").astype(int)
    twin = paste_faces_device(canvas, dev, strength, impl="torch").astype(int)
    assert np.abs(kernel - twin).max() <= 1 and np.abs(kernel - host).max() <= 2
    assert np.abs(host - canvas).max() > 30
