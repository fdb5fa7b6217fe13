"""How `enhance` plugs the switches into the face pipeline: one call.

    settings, restore, detector = tune_pipeline(settings, cfg, model, device)
    enhancer = Enhancer(settings, model=restore.model, restore=restore, detector=detector)
"""

from __future__ import annotations

from typing import Any

import torch

from gpen_tune.face.detect import Detector, init_detector
from gpen_tune.tune import face_crop
from gpen_tune.tune.options import TuneConfig
from gpen_tune.tune.restorer import Restorer, build_restorer


def tune_pipeline(settings: Any, cfg: TuneConfig, model: torch.nn.Module, device: str | torch.device | None = None,
                  notify=None, detector_policy: str = "tight") -> tuple[Any, Restorer, Detector | None]:
    """(settings with face_crop/det_size applied, the Restorer, a lazy detector or None = the pipeline's own).

    `settings` is the pipeline's EnhanceSettings (fields detector, detector_weights, det_threshold, det_size).
    """
    settings = face_crop.apply(settings, cfg)
    restore = build_restorer(model, cfg, device)
    detector = None
    if cfg.lazy_detector:
        kwargs = {"notify": notify} if notify is not None else {}
        detector = init_detector(settings.detector, device=restore.device, weights=settings.detector_weights,
                                 threshold=settings.det_threshold, det_size=settings.det_size, service="inline",
                                 lazy=True, lazy_policy=detector_policy, **kwargs)
    return settings, restore, detector
