"""The lazy-detector measurement: detector and generator in one process, detect then restore, peak GPU memory of
the restore phase with the detector kept resident vs released by `LazyDetector.before_restore`.

Needs the pipeline part (gpen_tune.face.detect.init_detector, gpen_tune.face.samples) and CUDA; otherwise it
returns the reason it did not run.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from gpen_tune.bench.measure import MiB, peaks, reset_peak
from gpen_tune.tune.lazy_detector import LazyDetector


def detector_parts() -> tuple[Callable | None, object | None, str | None]:
    """(init_detector, a real photo, reason when unavailable)."""
    try:
        from gpen_tune.face.detect import init_detector
        from gpen_tune.face.samples import mosaic
    except ImportError as e:
        return None, None, f"needs the pipeline part (gpen_tune.face): {e}"
    return init_detector, mosaic(), None


def measure(restore: Callable[[torch.Tensor], torch.Tensor], faces: torch.Tensor, device: torch.device,
            release: bool, detector: str = "auto") -> dict:
    """Peak memory of: build detector, detect on a photo, (release), restore `faces`. MiB; 'reason' if skipped."""
    if device.type != "cuda":
        return {"reason": "GPU memory only (CUDA)"}
    init_detector, photo, reason = detector_parts()
    if reason:
        return {"reason": reason}
    factory = functools.partial(init_detector, detector, device=str(device))
    lazy = LazyDetector(factory, policy="always" if release else "never", device=device)
    reset_peak(device)
    lazy.detect([photo])
    torch.cuda.synchronize(device)
    detect_phase = peaks(device)
    after_detect = torch.cuda.memory_allocated(device) / MiB
    name = lazy.name
    lazy.before_restore()
    torch.cuda.synchronize(device)
    before_restore = torch.cuda.memory_allocated(device) / MiB
    reset_peak(device)
    restore(faces.to(device))
    torch.cuda.synchronize(device)
    restore_phase = peaks(device)
    result = {
        "released": release,
        "detector": name,
        "allocated_after_detect_mib": after_detect,
        "allocated_before_restore_mib": before_restore,
        "detect_peak_allocated_mib": detect_phase["peak_allocated_mib"],
        "restore_peak_allocated_mib": restore_phase["peak_allocated_mib"],
        "restore_peak_reserved_mib": restore_phase["peak_reserved_mib"],
        "batch": int(faces.shape[0]),
    }
    lazy.close()
    torch.cuda.empty_cache()
    return result
