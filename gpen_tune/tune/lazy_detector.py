"""--lazy-detector: create the face detector on first use, release it before the generator when memory is tight.

What changes: the pipeline holds the detect package's lazy detector (`gpen_tune.face.detect.init_detector(...,
lazy=True)`, i.e. `LazyDetector`) instead of a detector. It builds the real detector on the first `detect`, and in
`before_restore` (the pipeline calls it before each generator batch) deletes it, collects garbage and empties the
CUDA cache when free device memory is below `min_free_bytes` (policy "tight") or every time (policy "always").
Why it helps: the detector's weights and cached cuDNN workspaces stay reserved for the whole run otherwise.
Tolerance: identical output (detections do not depend on when the detector was built).
Cost: rebuilding the detector (weights read from the page cache: tens of ms) each time it was released.
Fallback: none needed; on the CPU there is no device memory to free, so `is_supported` says so and the pipeline
keeps the plain detector (a lazy detector still works there, it simply never releases with policy "tight").
"""

from __future__ import annotations

import torch

from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    device = torch.device(device)
    if device.type != "cuda":
        return "the lazy detector frees GPU memory; on the CPU there is nothing to free"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


def apply(done: Applied) -> None:
    """Nothing on the generator: `Pipeline.detector` reads `tune.lazy_detector` when it builds the detector."""
