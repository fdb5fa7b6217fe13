"""Choices that contradict each other, checked in one place for the CLI and the library (light: no torch).

Each check raises ValueError with one line naming both flags and asking to choose one.
"""

from __future__ import annotations


def existing_policy(overwrite: bool, skip_existing: bool) -> str:
    """`enhance(existing=...)` from the two flags: "overwrite", "skip" or "refuse" (the default)."""
    if overwrite and skip_existing:
        raise ValueError("--overwrite and --skip-existing contradict each other: choose one")
    return "overwrite" if overwrite else "skip" if skip_existing else "refuse"


def check_scale_out(devices: str | None, ray: bool) -> None:
    """Several GPUs of this host, or a Ray cluster: not both."""
    if devices is not None and ray:
        raise ValueError("--devices runs on this host, --ray on a Ray cluster: choose one")


def check_detector_process(detector_process: bool, lazy_detector: bool) -> None:
    """A detector in its own process cannot be released before generator batches."""
    if detector_process and lazy_detector:
        raise ValueError("--detector-process runs the detector in its own process, which --lazy-detector cannot "
                         "release: choose one")
