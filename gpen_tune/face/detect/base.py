"""What every detector shares: the Detection record, the one-line error, the Detector interface, and the
backends' common part (shrink to det_size, batch images, map coordinates back).

Images are "HWC, RGB, uint8, [0, 255]". Detection runs on a copy whose long side is at most `det_size` and the
coordinates are mapped back.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import cv2
import numpy as np
import torch

DEFAULT_THRESHOLD = 0.9          # upstream GPEN keeps faces scoring > 0.9 (upstream's detector threshold)
DEFAULT_DET_SIZE = 1024          # long side for detection; upstream shrinks images > 1500 px to 1000 px
MAX_BATCH = 8                    # images per detector forward pass (RetinaFace: same-size images only)


class DetectorError(RuntimeError):
    """A detector that cannot be built; the message says what to do."""


def default_notify(msg: str) -> None:
    print(f"notice: {msg}", file=sys.stderr, flush=True)


@dataclass
class Detection:
    """One face: box x1y1x2y2, score, landmarks [5, 2] (x, y): left eye, right eye, nose, mouth L, mouth R
    (image-left first)."""

    box: np.ndarray
    score: float
    landmarks: np.ndarray

    def to_dict(self) -> dict:
        return {
            "box": [round(float(v), 2) for v in self.box],
            "score": round(float(self.score), 4),
            "landmarks": [[round(float(x), 2), round(float(y), 2)] for x, y in self.landmarks],
        }


@runtime_checkable
class Detector(Protocol):
    """The interface every detector (backend or service) implements."""

    name: str
    device: torch.device

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Faces of every HWC RGB uint8 image, highest score first, in the image's coordinates."""
        ...

    def before_restore(self) -> None:
        """Called before each generator batch: a lazy detector releases itself here when memory is tight."""
        ...

    def close(self) -> None:
        """Free the networks (and any thread or process); the detector cannot be used afterwards."""
        ...


class FaceDetector:
    """Common part of every backend: shrink to `det_size`, batch images, map coordinates back.

    `mixed_sizes`: the backend's `_detect_batch` takes a list of images of different sizes (else: same-size
    images are stacked into one array per call). `max_batch`: images per `_detect_batch` call.
    """

    name = "base"
    mixed_sizes = False
    max_batch = MAX_BATCH
    weights_path = None              # the weights file a backend was built from (None: shipped with the code)

    def __init__(self, device: str | torch.device, threshold: float | None, det_size: int | None):
        self.device = torch.device(device)
        self.threshold = DEFAULT_THRESHOLD if threshold is None else float(threshold)
        self.det_size = det_size

    def detect(self, images: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Faces of every image, highest score first."""
        results: list[list[Detection] | None] = [None] * len(images)
        groups: dict[tuple[int, int], list[tuple[int, np.ndarray, tuple[float, float]]]] = {}
        for i, img in enumerate(images):
            small, scale = self._shrink(img)
            groups.setdefault((0, 0) if self.mixed_sizes else small.shape[:2], []).append((i, small, scale))
        for members in groups.values():
            for start in range(0, len(members), self.max_batch):
                chunk = members[start:start + self.max_batch]
                batch = [m[1] for m in chunk] if self.mixed_sizes else np.stack([m[1] for m in chunk])
                with torch.inference_mode():
                    found = self._detect_batch(batch)
                for (i, _, (sx, sy)), (boxes, scores, lms) in zip(chunk, found, strict=True):
                    results[i] = _to_detections(boxes, scores, lms, sx, sy, self.threshold)
        return [r or [] for r in results]

    def follow(self, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
        """Faces of every image near known boxes (`boxes[i]`: [K, 4] x1y1x2y2 in image i's coordinates, e.g. the
        faces of a video's last key frame): a backend that can check given boxes (`_follow_batch`) does only that,
        much cheaper than a detection; the others detect the whole image."""
        if type(self)._follow_batch is FaceDetector._follow_batch:
            return self.detect(images)
        return follow_shrunk(self._follow_shrunk, images, boxes, self.det_size)

    def _follow_shrunk(self, images: Sequence[np.ndarray], boxes: Sequence[np.ndarray]) -> list[list[Detection]]:
        results: list[list[Detection]] = []
        for start in range(0, len(images), self.max_batch):
            end = start + self.max_batch
            with torch.inference_mode():
                found = self._follow_batch(list(images[start:end]), list(boxes[start:end]))
            results += [_to_detections(b, s, lm, 1.0, 1.0, self.threshold) for b, s, lm in found]
        return results

    def _follow_batch(self, batch: list[np.ndarray], boxes: list[np.ndarray]) -> list[tuple[np.ndarray, ...]]:
        """HWC images (any sizes) and known boxes in their coordinates -> per image (boxes, scores, landmarks)."""
        raise NotImplementedError

    def before_restore(self) -> None:
        """A backend keeps its networks between generator batches (the lazy wrapper releases them)."""

    def _shrink(self, img: np.ndarray) -> tuple[np.ndarray, tuple[float, float]]:
        return shrink_for_detection(img, self.det_size)

    def _detect_batch(self, batch) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """[B, H, W, 3] uint8 RGB (or a list of HWC arrays when `mixed_sizes`) -> per image (boxes [N, 4],
        scores [N], landmarks [N, 5, 2])."""
        raise NotImplementedError

    def to(self, device: str | torch.device) -> FaceDetector:
        self.device = torch.device(device)
        for net in self._networks():
            net.to(self.device)
        return self

    def close(self) -> None:
        """Free the networks; the detector cannot be used afterwards."""
        self._drop_networks()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _networks(self) -> list[torch.nn.Module]:
        return []

    def _drop_networks(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, device={str(self.device)!r}, threshold={self.threshold})"


def shrink_for_detection(img: np.ndarray, det_size: int | None) -> tuple[np.ndarray, tuple[float, float]]:
    """(copy whose long side is at most det_size, (sx, sy) = small / original size); as is below det_size."""
    if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
        raise ValueError(f"detector input must be HWC RGB uint8, got shape {img.shape} dtype {img.dtype}")
    h, w = img.shape[:2]
    if not det_size or max(h, w) <= det_size:
        return np.ascontiguousarray(img), (1.0, 1.0)
    k = det_size / max(h, w)
    nw, nh = max(1, round(w * k)), max(1, round(h * k))
    small = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_AREA)
    return small, (nw / w, nh / h)


def rescale(dets: list[Detection], sx: float, sy: float) -> list[Detection]:
    """Detections found on a copy scaled by (sx, sy), in the original image's coordinates."""
    if sx == 1.0 and sy == 1.0:
        return dets
    scale = np.array([sx, sy])
    return [Detection(box=d.box / np.tile(scale, 2), score=d.score, landmarks=d.landmarks / scale) for d in dets]


def detect_shrunk(detect, images, det_size: int) -> list[list[Detection]]:
    """`detect` (images -> detections per image) run on copies shrunk to det_size, results in the originals'
    coordinates: the caller's thread does the resizing (the detector services' callers use this)."""
    shrunk = [shrink_for_detection(img, det_size) for img in images]
    found = detect([small for small, _ in shrunk])
    return [rescale(dets, sx, sy) for dets, (_, (sx, sy)) in zip(found, shrunk, strict=True)]


def follow_shrunk(follow, images, boxes, det_size: int | None) -> list[list[Detection]]:
    """`follow` (images, known boxes -> detections per image) run on copies shrunk to det_size with the boxes
    scaled alike, results in the originals' coordinates (`detect_shrunk`'s twin for following)."""
    shrunk = [shrink_for_detection(img, det_size) for img in images]
    scaled = [np.asarray(b, np.float64).reshape(-1, 4) * np.tile(scale, 2)
              for b, (_, scale) in zip(boxes, shrunk, strict=True)]
    found = follow([small for small, _ in shrunk], scaled)
    return [rescale(dets, sx, sy) for dets, (_, (sx, sy)) in zip(found, shrunk, strict=True)]


def _to_detections(boxes, scores, lms, sx: float, sy: float, threshold: float) -> list[Detection]:
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    lms = np.asarray(lms, dtype=np.float64).reshape(-1, 5, 2)
    scale = np.array([sx, sy])
    out = []
    for i in np.argsort(-scores, kind="stable"):
        if scores[i] < threshold:
            continue
        out.append(Detection(box=boxes[i] / np.tile(scale, 2), score=float(scores[i]), landmarks=lms[i] / scale))
    return out
