"""--face-crop: never process a large image whole; detect on a downscaled copy, restore only the face regions.

What changes (pipeline settings, not the generator): the detector sees a copy whose long side is
`DEFAULT_DET_SIZE` (`gpen_tune.pipeline.settings.detection_size`; off: native resolution) and alignment warps,
masks and paste-back run on each face's bounding region instead of full-frame canvases per face (`paste_image`;
upstream warps two full-frame images and runs four full-frame passes per face: measured upstream, 3.8 s of CPU work
per 12 MP photo, growing with the photo, not the faces). Off = upstream-like whole-frame processing, kept for
comparison.
Why it helps: time and host/GPU memory scale with the faces, not with the megapixels; the detector's feature maps
at native 12+ MP resolution are the documented OOM source in GPEN #15.
Tolerance: the same faces restored; pixels outside the face regions untouched; landmarks from the downscaled
copy are scaled back (sub-pixel differences in alignment).
Measured by `benchmarks/face_crop_bench.py` on a >= 12 MP mosaic of the test photos (needs the pipeline).
Fallback: none needed (plain image arithmetic).
"""

from __future__ import annotations

import torch

from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    return None


def apply(done: Applied) -> None:
    """Nothing on the generator: the pipeline reads `tune.face_crop` (detection size, paste per face region)."""
