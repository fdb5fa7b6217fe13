"""Face detection behind one interface (`Detector`: boxes, scores and 5 landmarks per image) and one factory.

    detector = init_detector("auto", device="cuda", service="thread", lazy=False)
    faces = detector.detect([rgb_uint8_hwc, ...])        # list[list[Detection]], per image, best first
    detector.before_restore()                            # before each generator batch (lazy: may release)
    detector.close()

Backends (`name`): `retinaface_resnet50` / `retinaface_mobile0.25` (facexlib's RetinaFace, retinaface.py; weights
fetched into the cache, weights.py), `mtcnn` (facenet-pytorch's networks, weights in the wheel: offline; our
batched driver on a GPU, mtcnn.py), `auto` (RetinaFace-R50 when its weights are cached or downloadable, else MTCNN
with a one-line notice; build.py).
Services (`service`): "inline" (the backend itself: the serial path), "thread" (one batching thread serving many
caller threads, services.BatchingDetector), "process" (the backend in a child process of its own,
process.ProcessDetector). `lazy=True`: built on first use and released before generator batches when GPU memory
is tight (services.LazyDetector; behind the thread service with its SharedDetector guard); not with "process".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from gpen_tune.face.detect.base import (
    DEFAULT_DET_SIZE,
    DEFAULT_THRESHOLD,
    MAX_BATCH,
    Detection,
    Detector,
    DetectorError,
    FaceDetector,
    default_notify,
    detect_shrunk,
    rescale,
    shrink_for_detection,
)
from gpen_tune.face.detect.build import DETECTOR_NAMES, build_backend
from gpen_tune.face.detect.mtcnn import (
    MTCNN_MAX_BATCH,
    MTCNN_MIN_FACE,
    MTCNN_PYRAMID_FACTOR,
    MTCNN_STAGE_THRESHOLDS,
    PNET_GRAPHS_MIN_GIB,
    MTCNNDetector,
)
from gpen_tune.face.detect.process import LAZY_REFUSED, DetectorProcessError, DetectorSpec, ProcessDetector
from gpen_tune.face.detect.retinaface import NMS_IOU, RetinaFaceDetector
from gpen_tune.face.detect.services import (
    DEFAULT_MIN_FREE_BYTES,
    BatchingDetector,
    LazyDetector,
    Policy,
    SharedDetector,
    is_lazy,
)
from gpen_tune.face.detect.weights import (
    REACH_TIMEOUT_S,
    RETINAFACE_WEIGHTS,
    detector_cache_dir,
    fetch_weights,
)

Service = Literal["inline", "thread", "process"]
SERVICES = ("inline", "thread", "process")


def init_detector(
    name: str = "auto",
    *,
    device: str | torch.device = "cpu",
    weights: str | Path | None = None,
    threshold: float | None = None,
    det_size: int | None = DEFAULT_DET_SIZE,
    notify: Callable[[str], None] = default_notify,
    service: Service = "inline",
    lazy: bool = False,
    lazy_policy: Policy = "tight",
    processes: int = 1,
) -> Detector:
    """Build a face detector.

    Args:
        name: "auto", "retinaface_resnet50", "retinaface_mobile0.25" or "mtcnn".
        device: where the networks run.
        weights: RetinaFace weights: a local file, an http(s) URL (downloaded into the cache) or None (facexlib's
            release file, cached or downloaded). Ignored by mtcnn.
        threshold: minimum score (default 0.9, as upstream GPEN).
        det_size: long side of the copy that detection runs on (None = native resolution).
        notify: receives the one-line notice when `auto` falls back to MTCNN.
        service: "inline", "thread" or "process" (see the module docstring).
        lazy: build on first use, release before generator batches (policy `lazy_policy`: "tight" = when free
            GPU memory is below 4 GiB, "always", "never"); refused with service "process".
        processes: with service "process", how many detector processes share the callers' batches.
    """
    if service not in SERVICES:
        raise ValueError(f"service must be one of {', '.join(SERVICES)}, got {service!r}")
    if service == "process":
        if lazy:
            raise ValueError(LAZY_REFUSED)
        if name not in DETECTOR_NAMES:
            raise DetectorError(f"unknown detector {name!r}; choose one of: {', '.join(DETECTOR_NAMES)}")
        return ProcessDetector(DetectorSpec(name=name, device=str(device), threshold=threshold, det_size=det_size,
                                            weights=None if weights is None else str(weights),
                                            torch_threads=torch.get_num_threads()), processes=processes)
    build = functools.partial(build_backend, name, device=device, weights=weights, threshold=threshold,
                              det_size=det_size, notify=notify)
    detector = LazyDetector(build, policy=lazy_policy, device=device) if lazy else build()
    return serve(detector, service)


def serve(detector: Detector, service: Service, processes: int = 1) -> Detector:
    """A built detector behind `service`: "inline" as is; "thread" in a BatchingDetector (a lazy one behind its
    SharedDetector guard; a detector that already serves many threads is kept); "process" a ProcessDetector built
    like it, `processes` of them (kept if it is one; the detector it replaces stays open: its owner closes it; lazy:
    ValueError)."""
    if service not in SERVICES:
        raise ValueError(f"service must be one of {', '.join(SERVICES)}, got {service!r}")
    if service == "inline" or isinstance(detector, ProcessDetector):
        return detector
    if service == "thread":
        if isinstance(detector, BatchingDetector):
            return detector
        if is_lazy(detector) and not isinstance(detector, SharedDetector):
            detector = SharedDetector(detector)          # release only between detections
        return BatchingDetector(detector)
    return ProcessDetector(DetectorSpec.of(detector), processes=processes)


__all__ = [
    "DEFAULT_DET_SIZE", "DEFAULT_MIN_FREE_BYTES", "DEFAULT_THRESHOLD", "DETECTOR_NAMES", "MAX_BATCH",
    "MTCNN_MAX_BATCH", "MTCNN_MIN_FACE", "MTCNN_PYRAMID_FACTOR", "MTCNN_STAGE_THRESHOLDS", "NMS_IOU",
    "PNET_GRAPHS_MIN_GIB", "REACH_TIMEOUT_S", "RETINAFACE_WEIGHTS", "SERVICES", "BatchingDetector", "Detection",
    "Detector", "DetectorError", "DetectorProcessError", "DetectorSpec", "FaceDetector", "LazyDetector",
    "MTCNNDetector", "Policy", "ProcessDetector", "RetinaFaceDetector", "Service", "SharedDetector",
    "default_notify", "detect_shrunk", "detector_cache_dir", "fetch_weights", "init_detector", "is_lazy", "rescale",
    "serve", "shrink_for_detection",
]
