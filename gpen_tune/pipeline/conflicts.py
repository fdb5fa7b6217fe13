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


def serve_detector_process(asked: bool | None, device_type: str, lazy_detector: bool,
                           processes: int | None = None, request_processes: int = 0) -> bool:
    """`serve --detector-process` resolved: as asked, else on with `--detector-processes`, else on for a GPU server
    whose detector is not lazy and whose requests are detected here (with `--request-processes` each of those
    processes detects on a thread of its own; the server's detector serves only the jobs).

    A server on a GPU is limited by its request threads, the detector's among them (the GIL); its own process
    served 1.19x and 1.15x the faces/s with 64 clients on an H100, p99 0.71 and 0.61 s against 1.01 and 0.69 s
    (benchmarks/RESULTS.md, "Service"), for ~10 s more at start. On the CPU the generator is the limit."""
    if processes is not None:
        if asked is False:
            raise ValueError("--detector-thread and --detector-processes: choose one (several processes need "
                             "--detector-process)")
        return True
    if asked is not None:
        return asked
    return device_type == "cuda" and not lazy_detector and request_processes == 0


def check_detector_process(detector_process: bool, lazy_detector: bool) -> None:
    """A detector in its own process cannot be released before generator batches."""
    if detector_process and lazy_detector:
        raise ValueError("--detector-process runs the detector in its own process, which --lazy-detector cannot "
                         "release: choose one")
