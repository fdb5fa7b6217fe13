"""The backends by name: `retinaface_resnet50`, `retinaface_mobile0.25`, `mtcnn`, and `auto` (RetinaFace-R50 when
its weights are cached or downloadable, else MTCNN with a one-line notice). The factory in `__init__.py` puts
services around what this builds; the detector process builds its backend here too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from gpen_tune.choices import DETECTOR_NAMES
from gpen_tune.face.detect.base import DEFAULT_DET_SIZE, DetectorError, FaceDetector, default_notify
from gpen_tune.face.detect.mtcnn import MTCNNDetector
from gpen_tune.face.detect.retinaface import RetinaFaceDetector
from gpen_tune.face.detect.weights import (
    AUTO_RETINAFACE,
    auto_fallback_notice,
    auto_retinaface_weights,
    resolve_retinaface,
)


def build_backend(
    name: str = "auto",
    *,
    device: str | torch.device = "cpu",
    weights: str | Path | None = None,
    threshold: float | None = None,
    det_size: int | None = DEFAULT_DET_SIZE,
    notify: Callable[[str], None] = default_notify,
) -> FaceDetector:
    """The backend `name` itself (arguments as `gpen_tune.face.detect.init_detector`)."""
    if name not in DETECTOR_NAMES:
        raise DetectorError(f"unknown detector {name!r}; choose one of: {', '.join(DETECTOR_NAMES)}")
    if name == "mtcnn":
        return MTCNNDetector(device, threshold, det_size)
    if name == "retinaface_resnet50" or name == "retinaface_mobile0.25":
        return RetinaFaceDetector(name, resolve_retinaface(name, weights), device, threshold, det_size)
    path, reason = auto_retinaface_weights(weights)
    if path is not None:
        return RetinaFaceDetector(AUTO_RETINAFACE, path, device, threshold, det_size)
    notify(auto_fallback_notice(reason))
    return MTCNNDetector(device, threshold, det_size)
