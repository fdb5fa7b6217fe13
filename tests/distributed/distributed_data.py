"""Shared inputs of the scale-out tests: a small mixed folder (faces, no face, a broken file), the settings of a
GPEN-BFR-256 generator from an official-layout checkpoint, output comparison within 1 grey level, and restorers
whose device is lost, whose lane fails or whose worker process is killed."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import numpy as np
from conftest_weights import checkpoint_file
from PIL import Image

from gpen_tune.face import samples
from gpen_tune.load import load_model
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.restore import Restorer

MODEL = "GPEN-BFR-256"
BROKEN = "broken.png"
EXT = "png"          # lossless outputs: a 1-level difference before a JPEG encode can become 2 after it


def mixed_folder(folder: Path) -> Path:
    """astronaut, Grace Hopper (JPEG), a 3-face mosaic, a wall without faces and a file that is no image."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(samples.astronaut()).save(folder / "astronaut.png")
    Image.fromarray(samples.grace_hopper()).save(folder / "hopper.jpg", quality=92)
    Image.fromarray(samples.mosaic(3, 0)).save(folder / "mosaic.png")
    Image.fromarray(np.full((96, 128, 3), 90, np.uint8)).save(folder / "wall.png")
    (folder / BROKEN).write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    return folder


def settings(**overrides) -> EnhanceSettings:
    base = dict(model=MODEL, weights=str(checkpoint_file(MODEL)), detector="mtcnn", device="cpu", batch_size=3)
    return EnhanceSettings(**{**base, **overrides})


def read_outputs(folder: Path) -> dict[str, np.ndarray]:
    """Every file of an output folder (hidden temp files included, so a leftover would show) as pixels."""
    return {p.relative_to(folder).as_posix(): np.asarray(Image.open(p)) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def assert_same_outputs(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].shape == b[name].shape, name
        diff = np.abs(a[name].astype(np.int32) - b[name].astype(np.int32)).max()
        assert diff <= 1, f"{name}: {diff} grey levels apart"


def cpu_model():
    return load_model(str(checkpoint_file(MODEL)), model=MODEL, device="cpu")


class LosesDevice(Restorer):
    """A CPU restorer whose device is lost after `after` batches (every later batch raises as CUDA would).

    `done` is set once its `after` good batches are submitted (with `after=0`: at the loss): a `WaitsForLoss`
    device waiting on it starts then, while this device still takes inputs; its next batch is the lost one."""

    def __init__(self, after: int, done: threading.Event | None = None, max_batch: int = 3):
        super().__init__(cpu_model(), device="cpu", size=256, max_batch=max_batch)
        self.after = after
        self.done = done
        self.calls = 0

    def submit(self, crops, download: bool = True):
        self.calls += 1
        if self.calls > self.after:
            if self.done is not None:
                self.done.set()
            raise RuntimeError("CUDA error: device lost")
        pending = super().submit(crops, download)
        if self.calls == self.after and self.done is not None:
            self.done.set()
        return pending


class WaitsForLoss(Restorer):
    """A healthy CPU restorer that starts its first batch only once the other device has done its work before
    the loss, so that the lost device is sure to have had work (the wait is bounded, once, so that a broken run
    fails instead of hanging)."""

    def __init__(self, other_done: threading.Event, max_batch: int = 3, wait_s: float = 120.0):
        super().__init__(cpu_model(), device="cpu", size=256, max_batch=max_batch)
        self.other_done, self.wait_s = other_done, wait_s
        self.waited = False

    def submit(self, crops, download: bool = True):
        if not self.waited:
            self.other_done.wait(timeout=self.wait_s)
            self.waited = True
        return super().submit(crops, download)


class LosingFactory:
    """Builds a `LosesDevice` inside a worker process (picklable: the process mode's test hook)."""

    def __init__(self, after: int):
        self.after = after

    def __call__(self) -> LosesDevice:
        return LosesDevice(self.after)


class LaneStop(BaseException):
    """Not an `Exception`: the scheduler's stage threads let it through, as a bug in the scheduler itself."""


class FailsLane(Restorer):
    """A CPU restorer whose first batch raises `error` (a bug, not a device failure): it ends its lane's run."""

    def __init__(self, error: BaseException, failed: threading.Event):
        super().__init__(cpu_model(), device="cpu", size=256, max_batch=3)
        self.error, self.failed = error, failed

    def submit(self, crops, download: bool = True):
        self.failed.set()
        raise self.error


class KillsItsProcess(Restorer):
    """A CPU restorer that SIGKILLs its own process at its first batch, as the OOM killer would."""

    def __init__(self) -> None:
        super().__init__(cpu_model(), device="cpu", size=256, max_batch=3)

    def submit(self, crops, download: bool = True):
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL did not end this process")


class KillingFactory:
    """Builds a `KillsItsProcess` inside a worker process (picklable)."""

    def __call__(self) -> KillsItsProcess:
        return KillsItsProcess()
