"""The lazy-detector measurement: detector and generator in one process, detect then restore, peak GPU memory of
the restore phase with the detector kept resident vs released by `LazyDetector.before_restore`.

The detector is the pipeline's (gpen_tune.face.detect.init_detector). Default "retinaface-synthetic": upstream's
RetinaFace-R50 architecture with random weights written to a temporary file (its memory is what matters here,
and the GPU machine cannot download the real file); "auto", "mtcnn", ... are passed to init_detector as they are.
Without the pipeline part or CUDA the measurement returns the reason it did not run.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from gpen_tune.bench.measure import MiB, peaks, reset_peak
from gpen_tune.face.detect import LazyDetector

SYNTHETIC_RETINAFACE = "retinaface-synthetic"


def detector_factory(name: str, device: torch.device, workdir: str | Path | None = None
                     ) -> tuple[Callable | None, str]:
    """(factory building the detector, its name) or (None, the reason it cannot be built). Builds it once to check."""
    try:
        from gpen_tune.face.detect import init_detector  # optional: the pipeline part (gpen_tune.face)
    except ImportError as e:
        return None, f"needs the pipeline part (gpen_tune.face): {e}"
    try:
        if name == SYNTHETIC_RETINAFACE:
            from facexlib.detection.retinaface import RetinaFace  # optional: facexlib

            net = RetinaFace(network_name="resnet50", half=False, device="cpu")
            if workdir is None:              # the factory builds from this file until the process ends
                workdir = tempfile.mkdtemp(prefix="gpen-tune-bench-")
                atexit.register(shutil.rmtree, workdir, ignore_errors=True)
            path = Path(workdir) / "retinaface_r50_synthetic.pth"
            torch.save(net.state_dict(), path)
            del net
            factory = functools.partial(init_detector, "retinaface_resnet50", device=str(device), weights=path)
        else:
            factory = functools.partial(init_detector, name, device=str(device))
        det = factory()
        label = getattr(det, "name", name) + (" (random weights)" if name == SYNTHETIC_RETINAFACE else "")
        det.close()
        del det
        torch.cuda.empty_cache()
        return factory, label
    except Exception as e:  # a missing optional package, weights that cannot be fetched offline, ...
        return None, f"detector {name!r} unavailable: {type(e).__name__}: {str(e)[:200]}"


def photo():
    from gpen_tune.face.samples import mosaic  # optional: the pipeline part (gpen_tune.face)

    return mosaic()


def measure(restore: Callable[[torch.Tensor], torch.Tensor], faces: torch.Tensor, device: torch.device,
            release: bool, factory: Callable | None, label: str) -> dict:
    """Peak memory of: build detector, detect on a photo, (release), restore `faces`. MiB; 'reason' if skipped."""
    if device.type != "cuda":
        return {"reason": "GPU memory only (CUDA)"}
    if factory is None:
        return {"reason": label}
    lazy = LazyDetector(factory, policy="always" if release else "never", device=device)
    try:
        reset_peak(device)
        lazy.detect([photo()])
        torch.cuda.synchronize(device)
        detect_phase = peaks(device)
        after_detect = torch.cuda.memory_allocated(device) / MiB
        lazy.before_restore()
        torch.cuda.synchronize(device)
        before_restore = torch.cuda.memory_allocated(device) / MiB
        reset_peak(device)
        restore(faces.to(device))
        torch.cuda.synchronize(device)
        restore_phase = peaks(device)
    except Exception as e:
        return {"reason": f"{type(e).__name__}: {str(e)[:200]}"}
    finally:
        lazy.close()
        torch.cuda.empty_cache()
    return {
        "released": release,
        "detector": label,
        "allocated_after_detect_mib": after_detect,
        "allocated_before_restore_mib": before_restore,
        "detect_peak_allocated_mib": detect_phase["peak_allocated_mib"],
        "restore_peak_allocated_mib": restore_phase["peak_allocated_mib"],
        "restore_peak_reserved_mib": restore_phase["peak_reserved_mib"],
        "batch": int(faces.shape[0]),
    }
