"""Face tracking and One-Euro smoothing on synthetic detections (a still face with jitter, gaps, crossings)."""

from __future__ import annotations

import numpy as np
import pytest

from gpen_tune.face.detect import Detection
from gpen_tune.video import FaceTracker, OneEuroFilter

# five landmarks of a face ~100 px wide, relative to its centre: eyes, nose, mouth corners
FACE = np.array([[-25.0, -15.0], [25.0, -15.0], [0.0, 5.0], [-20.0, 25.0], [20.0, 25.0]])


def face_at(cx: float, cy: float, noise: np.ndarray | None = None, size: float = 100.0) -> Detection:
    lms = FACE * size / 100.0 + [cx, cy] + (0 if noise is None else noise)
    half = size / 2
    return Detection(box=np.array([cx - half, cy - half * 1.2, cx + half, cy + half * 1.2]), score=0.99,
                     landmarks=lms)


def _step_change(series: np.ndarray) -> float:
    """Mean frame-to-frame landmark displacement (px)."""
    return float(np.linalg.norm(np.diff(series, axis=0), axis=-1).mean())


def test_one_euro_steadies_a_still_signal_and_follows_a_moving_one():
    rng = np.random.default_rng(0)
    still = 10.0 + rng.normal(0, 1.0, 200)
    f = OneEuroFilter(min_cutoff=1.0, beta=0.0)
    out = np.array([f(np.array(x), t / 30) for t, x in enumerate(still)])
    assert out[50:].std() < 0.4 * still[50:].std()
    ramp = np.arange(120) * 2.0                                             # 60 units/s
    slow, fast = OneEuroFilter(1.0, beta=0.0), OneEuroFilter(1.0, beta=1.0)
    lag_slow = ramp[-1] - [slow(np.array(x), t / 30) for t, x in enumerate(ramp)][-1]
    lag_fast = ramp[-1] - [fast(np.array(x), t / 30) for t, x in enumerate(ramp)][-1]
    assert 0 <= lag_fast < 0.2 * lag_slow                                 # beta: less lag when moving


def test_smoothing_lowers_the_frame_to_frame_change_of_a_still_face():
    rng = np.random.default_rng(1)
    frames = [[face_at(200, 150, rng.normal(0, 1.5, (5, 2)))] for _ in range(90)]
    raw = np.stack([f[0].landmarks for f in frames])
    tracked = list(FaceTracker(fps=30).track(frames))
    smooth = np.stack([t[0].landmarks for t in tracked])
    assert {t[0].track_id for t in tracked} == {0}
    raw_change, smooth_change = _step_change(raw), _step_change(smooth)
    assert smooth_change < 0.5 * raw_change, (raw_change, smooth_change)
    assert np.abs(smooth[30:].mean(axis=0) - (FACE + [200, 150])).max() < 1.0      # no drift off the face

    plain = list(FaceTracker(fps=30, smooth=False).track(frames))
    assert np.array_equal(np.stack([t[0].landmarks for t in plain]), raw)


def test_a_short_gap_is_filled_and_a_long_one_ends_the_track():
    frames = [[face_at(100 + 2 * i, 120)] for i in range(20)]
    frames[8] = frames[9] = []                                            # detector missed 2 frames
    out = list(FaceTracker(fps=25, max_gap=3).track(frames))
    assert all(len(faces) == 1 for faces in out)
    assert [f[0].filled for f in out[7:11]] == [False, True, True, False]
    assert {f[0].track_id for f in out} == {0}
    assert np.allclose(out[8][0].landmarks, out[7][0].landmarks)          # held at the last smoothed place

    moving = list(FaceTracker(fps=25, max_gap=3, extrapolate=True).track(frames))
    assert moving[9][0].landmarks[:, 0].mean() > moving[7][0].landmarks[:, 0].mean() + 2   # carried along

    frames[8:14] = [[]] * 6                                               # longer than max_gap
    out = list(FaceTracker(fps=25, max_gap=3).track(frames))
    assert [len(f) for f in out[8:14]] == [1, 1, 1, 0, 0, 0]
    assert out[14][0].track_id != out[7][0].track_id and not out[14][0].filled


@pytest.mark.parametrize("smooth", [True, False])
def test_two_crossing_faces_keep_their_ids(smooth):
    frames = []
    for i in range(40):
        a = face_at(60 + 12 * i, 150)                                     # left to right
        b = face_at(540 - 12 * i, 175)                                    # right to left, a little lower
        frames.append([a, b] if i % 2 else [b, a])                        # detector order changes
    out = list(FaceTracker(fps=25, smooth=smooth).track(frames))
    right_id = next(f.track_id for f in out[0] if f.landmarks[:, 0].mean() < 300)
    for i, faces in enumerate(out):
        by_id = {f.track_id: f for f in faces}
        assert set(by_id) == {0, 1} and not any(f.filled for f in faces), i
        assert abs(by_id[right_id].landmarks[:, 0].mean() - (60 + 12 * i)) < 15, i
        assert abs(by_id[1 - right_id].landmarks[:, 0].mean() - (540 - 12 * i)) < 15, i
