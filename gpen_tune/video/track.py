"""Faces followed across frames, with steadied landmarks, so restored faces do not flicker.

Per frame: predict where each live track's face is now (its last landmarks moved by its velocity), match the
frame's detections to the predictions greedily by landmark distance (in face sizes) gated by box overlap, smooth the
matched landmarks and boxes with a One-Euro filter, start tracks for the unmatched detections, and stand in for a
face the detector missed for up to `max_gap` frames with the track's last smoothed landmarks (moved along its
velocity when `extrapolate`). A track unseen for more than `max_gap` frames ends. Pure numpy.

One-Euro filter (Casiez, Roussel, Vogel, CHI 2012): a first-order low-pass whose cutoff rises with the signal's
speed, so a still face is held steady (jitter removed at `min_cutoff` Hz) while a moving one is followed with
little lag (`beta` raises the cutoff per unit of speed). Landmarks are filtered in units of the face's size at
the start of the track, so the same `beta` suits small and large faces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

MIN_CUTOFF_HZ = 1.0         # jitter cutoff for a still face
BETA = 10.0                 # cutoff increase per face-size/s of speed
D_CUTOFF_HZ = 1.0           # cutoff of the speed estimate itself
MAX_GAP = 3                 # frames a missed face is filled for before its track ends
MIN_IOU = 0.2               # a detection this far off a track's predicted box is not that face ...
MAX_LANDMARK_DIST = 0.35    # ... unless its landmarks are within this many face sizes of the prediction


class OneEuroFilter:
    """The One-Euro filter on an array of any shape (each element filtered on its own), at irregular times.

    `min_cutoff` (Hz): cutoff at zero speed; `beta`: cutoff increase per unit of speed (units/s); `d_cutoff` (Hz):
    cutoff of the low-pass on the speed.
    """

    def __init__(self, min_cutoff: float = MIN_CUTOFF_HZ, beta: float = BETA, d_cutoff: float = D_CUTOFF_HZ):
        self.min_cutoff, self.beta, self.d_cutoff = float(min_cutoff), float(beta), float(d_cutoff)
        self.x: np.ndarray | None = None      # last filtered value
        self.dx: np.ndarray | None = None     # last filtered speed (units/s)
        self.t: float | None = None

    @staticmethod
    def alpha(cutoff: np.ndarray | float, dt: float) -> np.ndarray | float:
        """Smoothing factor of a first-order low-pass with `cutoff` Hz sampled every `dt` s: 1 / (1 + tau / dt)."""
        tau = 1.0 / (2.0 * math.pi * cutoff)
        return 1.0 / (1.0 + tau / dt)

    def __call__(self, x: np.ndarray, t: float) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if self.x is None or self.t is None or t <= self.t:
            if self.x is None or self.t is None:
                self.x, self.dx, self.t = x.copy(), np.zeros_like(x), t
            return self.x.copy()
        dt = t - self.t
        raw_dx = (x - self.x) / dt
        a_d = self.alpha(self.d_cutoff, dt)
        self.dx = a_d * raw_dx + (1.0 - a_d) * self.dx
        cutoff = self.min_cutoff + self.beta * np.abs(self.dx)
        a = self.alpha(cutoff, dt)
        self.x = a * x + (1.0 - a) * self.x
        self.t = t
        return self.x.copy()


@dataclass
class TrackedFace:
    """A Detection (box x1y1x2y2, score, landmarks [5, 2]) with its track id; `filled`: no detection this frame,
    the landmarks are the track's own; `raw_landmarks`: the detector's (None when filled)."""

    box: np.ndarray
    score: float
    landmarks: np.ndarray
    track_id: int
    filled: bool = False
    raw_landmarks: np.ndarray | None = None

    def to_dict(self) -> dict:
        return {
            "box": [round(float(v), 2) for v in self.box],
            "score": round(float(self.score), 4),
            "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in self.landmarks],
            "track_id": self.track_id,
            "filled": self.filled,
        }


@dataclass
class _Track:
    track_id: int
    scale: float                           # face size (box diagonal, px) at the start: the filter's unit
    landmarks: np.ndarray                  # last output landmarks [5, 2]
    box: np.ndarray
    score: float
    t: float
    velocity: np.ndarray = field(default_factory=lambda: np.zeros((5, 2)))   # px per frame
    missed: int = 0
    lm_filter: OneEuroFilter | None = None
    box_filter: OneEuroFilter | None = None

    def predicted(self) -> tuple[np.ndarray, np.ndarray]:
        """Landmarks and box where the face should be in the next frame: `missed + 1` frames along the velocity."""
        step = self.velocity * (self.missed + 1)
        shift = step.mean(axis=0)
        return self.landmarks + step, self.box + np.tile(shift, 2)


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two x1y1x2y2 boxes."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _diag(box: np.ndarray) -> float:
    return max(1.0, float(math.hypot(box[2] - box[0], box[3] - box[1])))


class FaceTracker:
    """Track ids and smoothed landmarks for a stream of per-frame detections (see the module docstring).

    `fps`: used for the time of frames given without one. `smooth` False: landmarks pass through as detected
    (tracking and gap filling still run). `max_gap`: frames a missed face is filled for; a track unseen for
    longer ends. `extrapolate`: filled faces move along the track's velocity instead of standing still.
    """

    def __init__(self, fps: float = 25.0, *, smooth: bool = True, min_cutoff: float = MIN_CUTOFF_HZ,
                 beta: float = BETA, d_cutoff: float = D_CUTOFF_HZ, max_gap: int = MAX_GAP,
                 extrapolate: bool = False, min_iou: float = MIN_IOU, max_landmark_dist: float = MAX_LANDMARK_DIST):
        self.fps = float(fps)
        self.smooth = smooth
        self.filter_args = (min_cutoff, beta, d_cutoff)
        self.max_gap = int(max_gap)
        self.extrapolate = extrapolate
        self.min_iou = min_iou
        self.max_landmark_dist = max_landmark_dist
        self.tracks: list[_Track] = []
        self.frame_index = 0
        self._next_id = 0

    def update(self, detections: Sequence, t: float | None = None) -> list[TrackedFace]:
        """Faces of one frame (objects with `box`, `landmarks`, `score`) -> tracked faces of that frame.

        `t`: the frame's time in seconds (the pts: variable frame rates are fine); None = frame index / fps.
        Output: matched and new faces in the input's order, then the filled ones.
        """
        t = self.frame_index / self.fps if t is None else float(t)
        self.frame_index += 1
        pairs = self._match(detections)
        out: list[TrackedFace] = []
        matched_tracks = set()
        for i, det in enumerate(detections):
            track = pairs.get(i)
            if track is None:
                track = self._start(det, t)
            else:
                self._advance(track, det, t)
            matched_tracks.add(track.track_id)
            out.append(TrackedFace(track.box.copy(), float(det.score), track.landmarks.copy(), track.track_id,
                                   raw_landmarks=np.asarray(det.landmarks, dtype=np.float64).copy()))
        live = []
        for track in self.tracks:
            if track.track_id not in matched_tracks:
                track.missed += 1
                if track.missed > self.max_gap:
                    continue
                out.append(self._fill(track))
            live.append(track)
        self.tracks = live
        return out

    def track(self, frames: Iterable[Sequence], times: Iterable[float] | None = None) -> Iterator[list[TrackedFace]]:
        """`update` over a sequence of frames' detections (and their times in seconds)."""
        times_iter = iter(times) if times is not None else None
        for dets in frames:
            yield self.update(dets, next(times_iter) if times_iter is not None else None)

    def _match(self, detections: Sequence) -> dict[int, _Track]:
        """Greedy assignment, cheapest first: detection index -> track. Few faces per frame, so greedy is enough
        (and unlike a global optimum it never trades a clear match for two doubtful ones)."""
        candidates = []
        for ti, track in enumerate(self.tracks):
            lm_pred, box_pred = track.predicted()
            for di, det in enumerate(detections):
                lms = np.asarray(det.landmarks, dtype=np.float64)
                dist = float(np.linalg.norm(lms - lm_pred, axis=1).mean()) / track.scale
                iou = box_iou(box_pred, np.asarray(det.box, dtype=np.float64))
                if iou >= self.min_iou or dist <= self.max_landmark_dist:
                    candidates.append((dist - iou * 0.1, ti, di))
        candidates.sort()
        used_tracks, pairs = set(), {}
        for _, ti, di in candidates:
            if ti in used_tracks or di in pairs:
                continue
            used_tracks.add(ti)
            pairs[di] = self.tracks[ti]
        return pairs

    def _start(self, det, t: float) -> _Track:
        box = np.asarray(det.box, dtype=np.float64).copy()
        track = _Track(self._next_id, _diag(box), np.asarray(det.landmarks, dtype=np.float64).copy(), box,
                       float(det.score), t)
        self._next_id += 1
        if self.smooth:
            track.lm_filter = OneEuroFilter(*self.filter_args)
            track.box_filter = OneEuroFilter(*self.filter_args)
            track.lm_filter(track.landmarks / track.scale, t)
            track.box_filter(track.box / track.scale, t)
        self.tracks.append(track)
        return track

    def _advance(self, track: _Track, det, t: float) -> None:
        lms = np.asarray(det.landmarks, dtype=np.float64)
        box = np.asarray(det.box, dtype=np.float64)
        if self.smooth:
            lms = track.lm_filter(lms / track.scale, t) * track.scale
            box = track.box_filter(box / track.scale, t) * track.scale
        frames = max(1, track.missed + 1)
        step = (lms - track.landmarks) / frames
        track.velocity = 0.5 * track.velocity + 0.5 * step
        track.landmarks, track.box, track.score, track.t, track.missed = lms, box, float(det.score), t, 0

    def _fill(self, track: _Track) -> TrackedFace:
        if self.extrapolate:                   # `missed` frames along the velocity (already counted this frame)
            step = track.velocity * track.missed
            lms, box = track.landmarks + step, track.box + np.tile(step.mean(axis=0), 2)
        else:
            lms, box = track.landmarks, track.box
        return TrackedFace(box.copy(), track.score, lms.copy(), track.track_id, filled=True)
