"""Shared inputs for the face pipeline tests: the offline detector, detections cached per test run, a keeping sink."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

SOLVAY_NAME = "solvay_conference_1927.png"
SOLVAY_FACES = 29


def solvay_path() -> Path | None:
    """The shared Solvay photo (never copied into the repo), or None when this checkout has no shared data."""
    for folder in (Path(__file__).resolve().parents[1] / ".." / "shared" / "data", Path("/work/shared/data")):
        p = folder / SOLVAY_NAME
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=1)
def mtcnn():
    from gpen_tune.face.detect import init_detector

    return init_detector("mtcnn", device="cpu")


@lru_cache(maxsize=8)
def _detect_cached(key: str):
    from gpen_tune.face import samples

    images = {"astronaut": samples.astronaut, "grace_hopper": samples.grace_hopper, "mosaic": samples.mosaic}
    img = images[key]()
    return img, mtcnn().detect([img])[0]


def detections(key: str) -> tuple[np.ndarray, list]:
    """(image, detections) for 'astronaut', 'grace_hopper' or 'mosaic' (detected once per test run)."""
    img, dets = _detect_cached(key)
    return img.copy(), dets


class KeepSink:
    """A sink that keeps what each job holds at write time (the scheduler frees the pixels after writing)."""

    ordered = False

    def __init__(self):
        self.jobs, self.results, self.restored = {}, {}, {}

    def write(self, job):
        self.jobs[job.index] = job
        self.results[job.index] = job.result.rgb.copy()
        self.restored[job.index] = [None if f.restored is None else f.restored.copy() for f in job.faces]


def serial_run(pipe, images) -> KeepSink:
    """`images` (arrays) through `pipe`'s serial path; what each job held when written."""
    from gpen_tune.pipeline import ArraySource

    sink = KeepSink()
    pipe.run(ArraySource(images), sink, serial=True)
    return sink
