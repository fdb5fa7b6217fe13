"""--face-crop: never process a large image whole; detect on a downscaled copy, restore only the face regions.

What changes (pipeline settings, not the generator): `det_size` = the long side the detector sees
(DETECT_LONG_SIDE; None = native resolution) and `face_crop` = True: alignment warps, masks and paste-back run on
each face's bounding region instead of full-frame canvases per face (upstream warps two full-frame images and
runs four full-frame passes per face: measured upstream, 3.8 s of CPU work per 12 MP photo, growing with the photo,
not the faces). Off = upstream-like whole-frame processing, kept for comparison.
Why it helps: time and host/GPU memory scale with the faces, not with the megapixels; the detector's feature maps
at native 12+ MP resolution are the documented OOM source in GPEN #15.
Tolerance: the same faces restored; pixels outside the face regions untouched; landmarks from the downscaled
copy are scaled back (sub-pixel differences in alignment).
Measured by `benchmarks/face_crop_bench.py` on a >= 12 MP mosaic of the test photos (needs the pipeline).
Fallback: none needed (plain image arithmetic).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from gpen_tune.face.detect.base import DEFAULT_DET_SIZE
from gpen_tune.tune.options import TuneConfig

# the detection copy's long side: the pipeline's one default (RetinaFace/MTCNN find faces >= ~20 px at this scale)
DETECT_LONG_SIDE = DEFAULT_DET_SIZE


def is_supported(device: str | torch.device, cfg: TuneConfig | None = None) -> str | None:
    return None


def pipeline_settings(cfg: TuneConfig) -> dict[str, Any]:
    """The pipeline fields this switch decides."""
    if cfg.face_crop:
        return {"face_crop": True, "det_size": DETECT_LONG_SIDE}
    return {"face_crop": False, "det_size": None}


def apply(settings: Any, cfg: TuneConfig) -> Any:
    """A copy of the pipeline's settings (a dataclass, a dict, or anything with those attributes) with the switch
    applied; a det_size the user already chose is kept when the switch is on."""
    values = pipeline_settings(cfg)
    chosen = settings.get("det_size") if isinstance(settings, dict) else getattr(settings, "det_size", None)
    if cfg.face_crop and chosen:
        values["det_size"] = chosen
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return dataclasses.replace(settings, **values)
    if isinstance(settings, dict):
        return {**settings, **values}

    settings = copy.copy(settings)
    for key, value in values.items():
        setattr(settings, key, value)
    return settings
