"""A detector built and run once on a thread of its own, while the caller does something else (loads the generator).

Why: on a GPU the process's first detection pays one-off set-up besides its own work (the networks' kernels
loaded, cuDNN's first convolutions, the detector's Triton kernels): ~0.8-1.0 s for MTCNN's P-Net on an H100
(benchmarks/results/20261206-135959_pnet_shapes.json, bucket 1), which a one-photo command otherwise pays after
its generator is built, in line before its first faces. Started before the generator loads, that set-up runs
beside it. Nothing depends on the warm-up's outcome: a failure here is dropped, and the caller builds the detector
again itself, where the same failure is reported properly.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

WARM_UP_SIDE = 320           # px: a blank-ish image large enough for several pyramid scales


def warm_up_image(side: int = WARM_UP_SIDE) -> np.ndarray:
    """Seeded noise over a gradient: gives P-Net cells and a few candidates, so the later stages run too."""
    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    image = (ramp[None, :, None] * 0.5 + rng.uniform(0, 127, (side, side, 3))).clip(0, 255)
    return image.astype(np.uint8)


class DetectorWarmUp:
    """`build()` (a detector) and one `detect` on `warm_up_image()`, on a daemon thread started at once;
    `result()` waits for it and gives the detector, or None where building or detecting failed."""

    def __init__(self, build: Callable[[], Any]):
        self._build = build
        self._detector: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpen-detector-warm-up", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            detector = self._build()
            detector.detect([warm_up_image()])
            self._detector = detector
        except Exception as exc:  # noqa: BLE001 - the caller builds it again and reports the failure there
            self.error = exc

    def result(self) -> Any:
        self._thread.join()
        return self._detector
