"""One device's parts for `DevicePool`: its restorer built there, and the guard that tells a device failure (the
device's fault, retried elsewhere) from an input's (reported for that input). Shared by the thread lanes
(devices.py) and the worker processes (workers.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpen_tune.pipeline.settings import EnhanceSettings, resolve_weights
from gpen_tune.restore import Restorer, build_restorer, default_batch_size
from gpen_tune.tune.options import TuneConfig

# what a device failure says (torch's CUDA runtime errors, cuBLAS/cuDNN failures, a GPU that fell off the bus)
DEVICE_FAILURE_MARKERS = ("cuda error", "device lost", "cublas_status", "cudnn_status", "device-side assert",
                          "illegal memory access", "unspecified launch failure", "ecc error", "gpu is lost",
                          "acceleratorerror")
def is_device_failure(error: BaseException | str | None) -> bool:
    """Whether an exception (or a job's one-line error) is the device's fault rather than the input's."""
    if error is None:
        return False
    text = (f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error).lower()
    return "out of memory" not in text and any(m in text for m in DEVICE_FAILURE_MARKERS)


class DeviceLost(RuntimeError):
    """A batch refused because its device failed earlier."""


class _GuardedBatch:
    def __init__(self, batch: Any, guard: GuardedRestorer):
        self._batch, self._guard = batch, guard

    def result(self) -> Any:
        try:
            return self._batch.result()
        except Exception as e:
            self._guard.observe(e)
            raise

    def __getattr__(self, name: str) -> Any:        # done(), device_out, submitted_at
        return getattr(self._batch, name)


class GuardedRestorer:
    """A device's restorer: a device failure marks the device lost; later batches are refused at once."""

    def __init__(self, restorer: Restorer, device: str):
        self.inner = restorer
        self.device_name = device
        self.lost: str | None = None                 # the failure's one line, once lost

    def observe(self, exc: BaseException) -> None:
        if is_device_failure(exc):
            self.mark_lost(f"{type(exc).__name__}: {' '.join(str(exc).split())}")

    def mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason

    def _check(self) -> None:
        if self.lost is not None:
            raise DeviceLost(f"CUDA error: device {self.device_name} lost earlier ({self.lost})")

    def submit(self, crops: Sequence[Any], download: bool = True) -> _GuardedBatch:
        self._check()
        try:
            return _GuardedBatch(self.inner.submit(crops, download=download), self)
        except Exception as e:
            self.observe(e)
            raise

    def restore_crops(self, crops: Sequence[Any]) -> Any:
        self._check()
        try:
            return self.inner.restore_crops(crops)
        except Exception as e:
            self.observe(e)
            raise

    def __getattr__(self, name: str) -> Any:        # limit, take, device, size, times, report fields
        return getattr(self.inner, name)


class on_device:
    """Make a GPU current while a lane's parts are built there (CUDA graphs capture on the current device)."""

    def __init__(self, device: str):
        self.context = torch.cuda.device(torch.device(device)) if device.startswith("cuda") else None

    def __enter__(self) -> None:
        if self.context is not None:
            self.context.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.context is not None:
            self.context.__exit__(*exc)


def build_lane_restorer(settings: EnhanceSettings, tune: TuneConfig, device: str,
                        notify: Callable[[str], None]) -> Restorer:
    """The generator behind its switches on one device (as `Pipeline` builds it)."""
    from gpen_tune.load import load_model  # the loader pulls in the weights registry: only when building

    dev = torch.device(device)
    model = load_model(resolve_weights(settings, notify), model=settings.model, device=dev)
    restorer = build_restorer(model, tune, device=dev, max_batch=settings.batch_size or default_batch_size(dev))
    for msg in restorer.fallbacks:
        notify(msg)
    return restorer


