"""How `enhance` plugs the switches into the face pipeline (gpen_tune.face, imported lazily): one call.

    settings, restore, detector = tune_pipeline(settings, cfg, model, device)
    enhancer = Enhancer(settings, model=restore.model, restore=restore, detector=detector)
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from gpen_tune.restore.restorer import Restorer, build_restorer
from gpen_tune.tune import face_crop
from gpen_tune.tune.lazy_detector import LazyDetector
from gpen_tune.tune.options import TuneConfig


def tune_pipeline(settings: Any, cfg: TuneConfig, model: torch.nn.Module, device: str | torch.device | None = None,
                  notify=None, detector_policy: str = "tight") -> tuple[Any, Restorer, LazyDetector | None]:
    """(settings with face_crop/det_size applied, the Restorer, a LazyDetector or None = the pipeline's own).

    `settings` is the pipeline's EnhanceSettings (fields detector, detector_weights, det_threshold, det_size,
    batch_size: the restorer's starting limit).
    """
    settings = face_crop.apply(settings, cfg)
    restore = build_restorer(model, cfg, device=device, max_batch=settings.batch_size)
    detector = None
    if cfg.lazy_detector:
        from gpen_tune.face.detect import init_detector  # the detectors (facexlib) only when asked for

        kwargs = {"notify": notify} if notify is not None else {}
        factory = functools.partial(init_detector, settings.detector, device=restore.device,
                                    weights=settings.detector_weights, threshold=settings.det_threshold,
                                    det_size=settings.det_size, **kwargs)
        detector = LazyDetector(factory, policy=detector_policy, device=restore.device)
    return settings, restore, detector
