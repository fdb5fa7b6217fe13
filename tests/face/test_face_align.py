"""Alignment: GPEN/FFHQ templates, our Umeyama fit, crop and exact inverse."""

from __future__ import annotations

import numpy as np
import pytest
from face_testdata import detections

from gpen_tune.face.align import (
    alignment,
    apply_affine,
    ffhq_template,
    gpen_template,
    invert_affine,
    template,
    umeyama,
    warp_crop,
)

# facts doc 2.4, table of template numbers
GPEN_512 = [(202.041, 242.884), (309.430, 242.290), (256.077, 303.959), (211.960, 366.828), (300.891, 366.336)]
GPEN_256 = [(101.020, 121.442), (154.715, 121.145), (128.038, 151.980), (105.980, 183.414), (150.446, 183.168)]
GPEN_1024_LEFT_EYE = (404.081, 485.768)


def test_gpen_template_numbers():
    np.testing.assert_allclose(gpen_template(512), GPEN_512, atol=1e-3)
    np.testing.assert_allclose(gpen_template(256), GPEN_256, atol=1e-3)
    np.testing.assert_allclose(gpen_template(1024)[0], GPEN_1024_LEFT_EYE, atol=1e-3)


def test_ffhq_template_scales_with_size():
    np.testing.assert_allclose(ffhq_template(512)[0], (192.98138, 239.94708))
    np.testing.assert_allclose(ffhq_template(1024), ffhq_template(512) * 2)
    assert template("ffhq", 256).shape == (5, 2)
    with pytest.raises(ValueError, match="gpen"):
        template("arcface", 512)


@pytest.mark.parametrize("angle,scale,shift", [(0.0, 1.0, (0, 0)), (17.0, 0.31, (40.5, -12.0)),
                                               (-33.0, 2.7, (-300.0, 77.0))])
def test_umeyama_recovers_an_exact_similarity(angle, scale, shift):
    tpl = gpen_template(512)
    a = np.deg2rad(angle)
    rot = scale * np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    pts = tpl @ rot.T + shift                        # landmarks that ARE a similarity image of the template
    m, inv = alignment(pts, 512, "gpen")
    assert np.abs(apply_affine(m, pts) - tpl).max() < 1e-6        # well within 1 px
    assert np.abs(apply_affine(inv, tpl) - pts).max() < 1e-6
    np.testing.assert_allclose(np.vstack([inv, [0, 0, 1]]) @ np.vstack([m, [0, 0, 1]]), np.eye(3), atol=1e-12)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_umeyama_equals_independent_fit_on_real_landmarks():
    from skimage.transform import SimilarityTransform

    for key in ("astronaut", "grace_hopper", "mosaic"):
        _, dets = detections(key)
        for d in dets:
            for size in (256, 512):
                tpl = gpen_template(size)
                ours = apply_affine(umeyama(d.landmarks, tpl)[:2], d.landmarks)
                ref = SimilarityTransform()
                assert ref.estimate(d.landmarks, tpl)
                np.testing.assert_allclose(ours, ref(d.landmarks), atol=1e-6)
                # the fit is least squares: moving it by a pixel only makes the residual worse
                base = ((ours - tpl) ** 2).sum()
                for dx, dy in ((1, 0), (0, 1), (-1, 0), (0, -1)):
                    assert ((ours + (dx, dy) - tpl) ** 2).sum() > base


def test_no_reflection_even_for_mirrored_points():
    tpl = gpen_template(256)
    mirrored = tpl * (-1, 1)
    m = umeyama(mirrored, tpl)
    assert np.linalg.det(m[:2, :2]) > 0


def test_crop_puts_the_face_where_the_template_is():
    img, dets = detections("astronaut")
    m, inv = alignment(dets[0].landmarks, 512, "gpen")
    crop = warp_crop(img, m, 512)
    assert crop.shape == (512, 512, 3) and crop.dtype == np.uint8
    # re-detecting on the crop finds the face near the transformed landmarks
    from face_testdata import mtcnn

    (again,) = mtcnn().detect([crop])
    assert len(again) == 1
    moved = apply_affine(m, dets[0].landmarks)
    eye_dist = np.linalg.norm(moved[1] - moved[0])
    assert np.abs(again[0].landmarks - moved).max() < 0.1 * eye_dist
    # sampling the crop through the inverse lands on the same image pixels
    yx = np.array([[250, 260], [300, 240]])
    for y, x in yx:
        sx, sy = apply_affine(inv, np.array([[x, y]], float))[0]
        assert np.abs(crop[y, x].astype(int) - img[int(round(sy)), int(round(sx))].astype(int)).max() < 40


def test_invert_affine_exact():
    m = np.array([[1.3, -0.2, 14.0], [0.2, 1.3, -7.5]])
    np.testing.assert_allclose(invert_affine(invert_affine(m)), m, atol=1e-12)


def _reference_crop(image: np.ndarray, affine: np.ndarray, size: int) -> np.ndarray:
    """The crop's definition written out: float64 inverse map, positions rounded to 1/32 px, the four neighbours
    clamped to the image, integer weights in 1/1024, rounded half up."""
    inv = invert_affine(affine)
    r, c = np.mgrid[0:size, 0:size].astype(np.float64)
    x = np.rint(inv[0, 0] * c * 32).astype(np.int64) + np.rint((inv[0, 1] * r + inv[0, 2]) * 32).astype(np.int64)
    y = np.rint(inv[1, 0] * c * 32).astype(np.int64) + np.rint((inv[1, 1] * r + inv[1, 2]) * 32).astype(np.int64)
    ix, fx, iy, fy = x >> 5, (x & 31)[..., None], y >> 5, (y & 31)[..., None]
    h, w = image.shape[:2]

    def px(yy, xx):
        return image[np.clip(yy, 0, h - 1), np.clip(xx, 0, w - 1)].astype(np.int64)

    acc = ((32 - fx) * (32 - fy) * px(iy, ix) + fx * (32 - fy) * px(iy, ix + 1)
           + (32 - fx) * fy * px(iy + 1, ix) + fx * fy * px(iy + 1, ix + 1))
    return ((acc + 512) >> 10).astype(np.uint8)


def _random_affines(n: int, seed: int = 0) -> list[np.ndarray]:
    """Rotations, scales 0.3-3 and shifts that put the crop partly or wholly outside the 512x512 image."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a, s = rng.uniform(-0.7, 0.7), rng.uniform(0.3, 3.0)
        out.append(np.array([[s * np.cos(a), -s * np.sin(a), rng.uniform(-400, 150)],
                             [s * np.sin(a), s * np.cos(a), rng.uniform(-400, 150)]]))
    return out


def test_crop_is_the_fixed_point_definition_on_real_faces_and_borders():
    """warp_crop (OpenCV's integer remap on our tables) equals the definition bit for bit: real alignments of the
    bundled photos and random affines that run off every border (replicated, not black)."""
    img, dets = detections("astronaut")
    cases = [alignment(d.landmarks, 512, "gpen")[0] for d in dets] + _random_affines(12)
    for m in cases:
        got = warp_crop(img, m, 512)
        np.testing.assert_array_equal(got, _reference_crop(img, m, 512))
    far = np.array([[1.0, 0.0, -5000.0], [0.0, 1.0, -5000.0]])          # crop entirely beyond the bottom right
    np.testing.assert_array_equal(warp_crop(img, far, 8), np.broadcast_to(img[-1, -1], (8, 8, 3)))
    huge = np.array([[0.001, 0.0, 0.0], [0.0, 0.001, 0.0]])               # positions beyond int16 (saturated)
    np.testing.assert_array_equal(warp_crop(img, huge, 64), _reference_crop(img, huge, 64))
    # table terms too large for float32's exact maps, whose sums still land in the image (column 500 reads x = 0)
    a = 2000 + 1 / 64                                         # odd table entries beyond 2**24: not exact in float32
    wide = invert_affine(np.array([[a, 0.0, -a * 500 + 0.5 + 1 / 32], [0.0, 1.0, 3.0]]))
    got = warp_crop(img, wide, 512)
    np.testing.assert_array_equal(got, _reference_crop(img, wide, 512))
    p0, p1 = img[3:512, 0].astype(int), img[3:512, 1].astype(int)             # column 500 reads x = 17/32
    np.testing.assert_array_equal(got[:509, 500], (15 * 32 * p0 + 17 * 32 * p1 + 512) >> 10)


def test_device_crop_twin_equals_warp_crop():
    """The kernel's PyTorch twin (ops.warp_crop, impl="torch") and cut_faces_device: the bits of the host crop for
    every face of an image, a non-square image and random affines reaching past the borders."""
    import torch

    from gpen_tune.face.align import cut_faces_device, face_tables
    from gpen_tune.ops.warp_crop import warp_crops

    img, dets = detections("mosaic")
    img = np.ascontiguousarray(img[:, : img.shape[1] - 37])
    affines = [alignment(d.landmarks, 64, "gpen")[0] for d in dets] + _random_affines(4, seed=3)
    want = np.stack([warp_crop(img, m, 64) for m in affines])
    got = warp_crops(torch.from_numpy(img), torch.from_numpy(face_tables(affines, 64)), impl="torch").numpy()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cut_faces_device(torch.from_numpy(img), affines, 64, impl="torch").numpy(), want)
    assert np.abs(want.astype(int) - want[:1]).max() > 50                     # the crops differ


@pytest.mark.slow
def test_device_crop_kernel_equals_warp_crop_in_interpreter():
    """The GPU kernel (ops.warp_crop), run in Triton's interpreter: same bits as warp_crop for every face of
    an image in one launch, a non-square image, and border cases."""
    from triton_interp import run_in_interpreter

    res = run_in_interpreter("""
import json
import numpy as np, torch
from face_testdata import detections
from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.align import face_tables
from gpen_tune.ops.warp_crop import warp_crops
from test_face_align import _random_affines
img, dets = detections("mosaic")
img = np.ascontiguousarray(img[:, : img.shape[1] - 37])
affines = [alignment(d.landmarks, 64, "gpen")[0] for d in dets] + _random_affines(4, seed=3)
tables = torch.from_numpy(face_tables(affines, 64))
got = warp_crops(torch.from_numpy(img), tables, impl="triton").numpy()
want = np.stack([warp_crop(img, m, 64) for m in affines])
print("RESULT" + json.dumps({"faces": len(affines), "max": int(np.abs(got.astype(int) - want).max()),
                              "changed": int(np.abs(want.astype(int) - want[:1]).max())}))
""".replace("from face_testdata", "import sys; sys.path[:0] = ['tests', 'tests/face']\nfrom face_testdata"))
    assert res["faces"] >= 6 and res["max"] == 0 and res["changed"] > 50, res


@pytest.mark.gpu
def test_cuda_device_crops_equal_warp_crop():
    import torch

    from gpen_tune.face.align import face_tables
    from gpen_tune.ops import warp_crop as warp_op

    if not warp_op.available(torch.device("cuda")):
        pytest.skip("needs Triton")
    img, dets = detections("mosaic")
    affines = [alignment(d.landmarks, 512, "gpen")[0] for d in dets] + _random_affines(6, seed=5)
    dev = torch.device("cuda")
    got = warp_op.warp_crops(torch.from_numpy(img).to(dev), torch.from_numpy(face_tables(affines, 512)).to(dev),
                             impl="triton").cpu().numpy()
    for g, m in zip(got, affines, strict=True):
        np.testing.assert_array_equal(g, warp_crop(img, m, 512))
