"""Paste-back: identity round trip, strength, ROI-only, overlapping faces, small-face softening."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from face_testdata import detections, mtcnn, serial_run

from gpen_tune.face.align import alignment, warp_crop
from gpen_tune.face.paste import (
    SMOOTH_KERNEL,
    PasteFace,
    face_mask,
    feather,
    is_small_face,
    paste_faces,
    paste_faces_full_frame,
    paste_region,
    soften,
)
from gpen_tune.pipeline import EnhanceSettings, Pipeline
from gpen_tune.restore import as_restorer


def identity(batch):
    """The generator stand-in: returns its input."""
    return batch


def _round_trip(img: np.ndarray, size: int, **settings) -> tuple[np.ndarray, list]:
    s = EnhanceSettings(device="cpu", **{"soften_small_faces": False, **settings})
    pipe = Pipeline(s, restorer=as_restorer(identity, device="cpu", size=size), detector=mtcnn())
    sink = serial_run(pipe, [img])
    return sink.results[0], sink.jobs[0].faces


# Two bilinear resamplings (crop, then inverse warp) cannot reproduce sharp detail exactly (unfiltered astronaut:
# up to 25 levels at 512); the consistency of warp, inverse warp and mask is shown on the same real photos
# low-pass filtered (sigma 2 px), where bilinear resampling itself is accurate to a grey level or two. A half-pixel
# error in the inverse or a mask reaching outside the valid crop would break the bound by an order of magnitude.
@pytest.mark.parametrize("key,size", [("astronaut", 512), ("mosaic", 1024)])
def test_identity_round_trip_within_2_levels(key, size):
    img, _ = detections(key)
    smooth = cv2.GaussianBlur(img, (0, 0), 2.0)
    out, faces = _round_trip(smooth, size)
    assert len(faces) == (1 if key == "astronaut" else 6)
    diff = np.abs(out.astype(int) - smooth.astype(int))
    assert diff.max() <= 2
    assert (diff > 0).sum() > 500                            # the faces really were pasted


def test_round_trip_detects_a_misplaced_inverse():
    img, dets = detections("astronaut")
    smooth = cv2.GaussianBlur(img, (0, 0), 2.0)
    m, inv = alignment(dets[0].landmarks, 512)
    crop = warp_crop(smooth, m, 512)
    good = paste_faces(smooth, [PasteFace(crop, inv)])
    shifted = inv.copy()
    shifted[:, 2] += 0.75
    bad = paste_faces(smooth, [PasteFace(crop, shifted)])
    assert np.abs(good.astype(int) - smooth).max() <= 2
    assert np.abs(bad.astype(int) - smooth).max() > 6


def test_strength_zero_gives_input_back_exactly():
    img, _ = detections("mosaic")
    out, faces = _round_trip(img, 256, strength=0.0)
    assert len(faces) == 6 and np.array_equal(out, img)
    assert np.array_equal(paste_faces(img, [PasteFace(np.zeros((64, 64, 3), np.uint8), np.eye(2, 3))], 0.0), img)


def test_strength_blends_linearly():
    img, dets = detections("astronaut")
    m, inv = alignment(dets[0].landmarks, 256)
    grey = np.full((256, 256, 3), 200, np.uint8)
    full = paste_faces(img, [PasteFace(grey, inv)], 1.0).astype(float)
    half = paste_faces(img, [PasteFace(grey, inv)], 0.5).astype(float)
    np.testing.assert_allclose(half, (full + img) / 2, atol=1.01)


def test_paste_touches_only_the_face_region():
    img, dets = detections("mosaic")
    h, w = img.shape[:2]
    faces, regions = [], []
    for d in dets:
        m, inv = alignment(d.landmarks, 256)
        faces.append(PasteFace(np.full((256, 256, 3), 255, np.uint8), inv))
        regions.append(paste_region(inv, 256, w, h))
    out = paste_faces(img, faces)
    outside = np.ones((h, w), bool)
    for x0, y0, x1, y1 in regions:
        assert (x1 - x0) * (y1 - y0) < 0.2 * h * w              # each region is a small part of the frame
        outside[y0:y1, x0:x1] = False
    assert np.array_equal(out[outside], img[outside])
    assert (out != img).any(axis=2).sum() > 6 * 1000


def test_overlapping_faces_larger_mask_wins_without_seams():
    base = np.full((300, 400, 3), 50, np.uint8)
    inv_a = np.array([[0.8, 0, 40], [0, 0.8, 40]])            # two 256-crops overlapping in the middle
    inv_b = np.array([[0.8, 0, 150], [0, 0.8, 60]])
    red = np.zeros((256, 256, 3), np.uint8)
    red[..., 0] = 250
    blue = np.zeros((256, 256, 3), np.uint8)
    blue[..., 2] = 250
    out = paste_faces(base, [PasteFace(red, inv_a), PasteFace(blue, inv_b)])
    ref = paste_faces_full_frame(base, [PasteFace(red, inv_a), PasteFace(blue, inv_b)])
    assert np.abs(out.astype(int) - ref).max() <= 1            # same as upstream's full-frame rule
    # each pixel equals the face whose warped mask is larger there
    mask = face_mask(256)
    ma = cv2.warpAffine(mask, inv_a, (400, 300))
    mb = cv2.warpAffine(mask, inv_b, (400, 300))
    both = (ma > 0.1) & (mb > 0.1)
    red_wins = both & (ma > mb + 0.05)
    blue_wins = both & (mb > ma + 0.05)
    assert red_wins.sum() > 100 and blue_wins.sum() > 100
    assert (out[red_wins][:, 0] > out[red_wins][:, 2]).all()
    assert (out[blue_wins][:, 2] > out[blue_wins][:, 0]).all()


def test_overlapping_crops_of_the_same_face_leave_no_seam():
    img, dets = detections("astronaut")
    smooth = cv2.GaussianBlur(img, (0, 0), 2.0)
    lm = dets[0].landmarks
    centre = lm.mean(0)
    faces = []
    for k, dx in ((1.0, 0.0), (1.25, 14.0), (0.8, -9.0)):     # three overlapping crops around the same face
        m, inv = alignment((lm - centre) * k + centre + (dx, 0), 512)
        faces.append(PasteFace(warp_crop(smooth, m, 512), inv))
    out = paste_faces(smooth, faces)
    assert np.abs(out.astype(int) - smooth).max() <= 2


def test_full_frame_path_agrees_with_roi_path():
    img, dets = detections("mosaic")
    s = 256
    faces = []
    for d in dets:
        m, inv = alignment(d.landmarks, s)
        faces.append(PasteFace(255 - warp_crop(img, m, s), inv))
    a = paste_faces(img, faces, 0.8)
    b = paste_faces_full_frame(img, faces, 0.8)
    assert np.abs(a.astype(int) - b).max() <= 1


def test_mask_scales_with_crop_size_like_upstream():
    m512, m1024 = face_mask(512), face_mask(1024)
    assert m512[0].max() < 1e-4 and m512[256, :8].max() < 1e-3     # 26-px border cleared, then blurred
    assert abs(m512[256, 256] - 1.0) < 1e-6
    # the feather is twice as wide at 1024: the 0.5 crossing sits at twice the distance from the edge
    c512 = np.argmax(m512[256] >= 0.5)
    c1024 = np.argmax(m1024[256] >= 0.5)
    assert abs(c1024 - 2 * c512) <= 2
    assert not m512.flags.writeable
    ones = feather(np.ones((512, 512), np.float32))
    np.testing.assert_array_equal(ones, m512)


def test_small_face_softening():
    assert is_small_face(np.array([0, 0, 99, 150])) and not is_small_face(np.array([0, 0, 100, 100]))
    img, dets = detections("astronaut")
    assert is_small_face(dets[0].box)                              # 88 px wide: upstream would soften it
    face = np.zeros((9, 9, 3), np.uint8)
    face[4, 4] = 160
    out = soften(face)
    assert out[4, 4, 0] == 40 and out[3, 4, 0] == 20 and out[3, 3, 0] == 10
    assert SMOOTH_KERNEL.sum() == pytest.approx(1.0)
    soft, _ = _round_trip(img, 256, soften_small_faces=True)
    sharp, _ = _round_trip(img, 256)
    assert not np.array_equal(soft, sharp)


@pytest.mark.slow
def test_face_parser_end_to_end_with_random_parsenet(tmp_path):
    """ParseNet built from facexlib's architecture (random init, saved in its layout); ~25 s per face on CPU."""
    import torch
    from facexlib.parsing.parsenet import ParseNet

    from gpen_tune.face.parse import FaceParser

    torch.manual_seed(0)
    path = tmp_path / "parsing_parsenet.pth"
    torch.save(ParseNet(in_size=512, out_size=512, parsing_ch=19).state_dict(), path)
    parser = FaceParser("cpu", weights=path)
    img, dets = detections("astronaut")
    m, _ = alignment(dets[0].landmarks, 256)
    (mask,) = parser.masks([warp_crop(img, m, 256)])
    assert mask.shape == (256, 256) and 0.0 <= mask.min() and mask.max() <= 1.0
    assert mask[:3].max() < 1e-3                                                  # border cleared
