"""--lazy-detector: create the face detector on first use, release it before the generator when memory is tight.

What changes: the pipeline holds a `LazyDetector` instead of a detector. It builds the real detector (through the
factory, e.g. `functools.partial(init_detector, "auto", device="cuda")`) on the first `detect`, and in
`before_restore` (the pipeline calls it before each generator batch) deletes it, collects garbage and empties the
CUDA cache when free device memory is below `min_free_bytes` (policy "tight") or every time (policy "always").
The next `detect` builds it again.
Why it helps: the detector's weights and its cached cuDNN workspaces stay reserved for the whole run otherwise;
upstream's RetinaFace-R50 also turns on cuDNN benchmark mode whose workspaces can reach tens of GB. Releasing them
gives the generator that memory (bigger face batches, or a smaller card).
Tolerance: identical output (detections do not depend on when the detector was built).
Cost: rebuilding the detector (weights read from the page cache: tens of ms) each time it was released.
Fallback: none needed; on the CPU there is no device memory to free, so `is_supported` says so and the pipeline
keeps the plain detector (a LazyDetector still works there, it simply never releases with policy "tight").
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, Literal

import torch

from gpen_tune.tune.options import TuneConfig

Policy = Literal["tight", "always", "never"]
DEFAULT_MIN_FREE_BYTES = 4 * 1024**3  # release when less than this is free before a generator batch


def is_supported(device: str | torch.device, cfg: TuneConfig | None = None) -> str | None:
    device = torch.device(device)
    if device.type != "cuda":
        return "the lazy detector frees GPU memory; on the CPU there is nothing to free"
    if not torch.cuda.is_available():
        return "CUDA is not available"
    return None


class LazyDetector:
    """A detector built on demand and released before generator batches when memory is tight.

    Args:
        factory: builds the real detector (an object with `.detect(images)` and optionally `.close()`).
        policy: "tight" releases when free device memory < min_free_bytes, "always" releases before every
            generator batch, "never" keeps it (a plain lazily-built detector).
        min_free_bytes: threshold for "tight".
        device: the device whose free memory is checked (default: the detector's `.device`, else cuda:0).
        free_memory: (device) -> free bytes; default torch.cuda.mem_get_info. Only the policy reads it.
    """

    def __init__(self, factory: Callable[[], Any], policy: Policy = "tight",
                 min_free_bytes: int = DEFAULT_MIN_FREE_BYTES, device: str | torch.device | None = None,
                 free_memory: Callable[[torch.device], int] | None = None):
        if policy not in ("tight", "always", "never"):
            raise ValueError(f"policy must be 'tight', 'always' or 'never', got {policy!r}")
        self.factory = factory
        self.policy = policy
        self.min_free_bytes = min_free_bytes
        self._device = torch.device(device) if device is not None else None
        self._free_memory = free_memory
        self._detector: Any | None = None
        self.builds = 0
        self.releases = 0

    # the pipeline's view of a detector ----------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._detector is not None

    @property
    def detector(self) -> Any:
        """The real detector, built now if needed."""
        if self._detector is None:
            self._detector = self.factory()
            self.builds += 1
        return self._detector

    @property
    def name(self) -> str:
        return getattr(self.detector, "name", type(self.detector).__name__)

    @property
    def device(self) -> torch.device:
        if self._device is not None:
            return self._device
        if self._detector is not None and getattr(self._detector, "device", None) is not None:
            return torch.device(self._detector.device)
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        """Anything else the pipeline reads (e.g. `det_size`) comes from the real detector, built if needed."""
        if name.startswith("_") or name in ("factory", "policy", "min_free_bytes", "builds", "releases"):
            raise AttributeError(name)
        return getattr(self.detector, name)

    def detect(self, images: list) -> list:
        return self.detector.detect(images)

    def to(self, device: str | torch.device) -> LazyDetector:
        self._device = torch.device(device)
        if self._detector is not None and hasattr(self._detector, "to"):
            self._detector = self._detector.to(device) or self._detector
        return self

    def before_restore(self) -> bool:
        """Called by the pipeline before each generator batch; returns True when the detector was released."""
        if self._detector is None or self.policy == "never":
            return False
        if self.policy == "always" or self._memory_is_tight():
            self.release()
            return True
        return False

    def close(self) -> None:
        self.release()

    # ----------------------------------------------------------------------------------------------------------

    def release(self) -> None:
        """Drop the detector: close it (frees its weights), delete our reference, collect, empty the CUDA cache."""
        det, self._detector = self._detector, None
        if det is None:
            return
        close = getattr(det, "close", None)
        if callable(close):
            close()
        del det, close
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.releases += 1

    def _memory_is_tight(self) -> bool:
        device = self.device
        if self._free_memory is not None:
            return self._free_memory(device) < self.min_free_bytes
        if device.type != "cuda" or not torch.cuda.is_available():
            return False  # nothing to free on the host
        free, _total = torch.cuda.mem_get_info(device)
        return free < self.min_free_bytes


def apply(detector_factory: Callable[[], Any], cfg: TuneConfig, device: str | torch.device = "cuda",
          policy: Policy = "tight", min_free_bytes: int = DEFAULT_MIN_FREE_BYTES) -> Any:
    """What the pipeline holds: a LazyDetector when the switch is on, else the detector built now."""
    if cfg.lazy_detector:
        return LazyDetector(detector_factory, policy=policy, min_free_bytes=min_free_bytes, device=device)
    return detector_factory()
