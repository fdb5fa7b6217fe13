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
