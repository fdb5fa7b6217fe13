"""Timing and memory: CUDA events with synchronisation on both sides, median of N after warm-up, peak memory."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

MiB = 1024**2


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Milliseconds of `repeats` calls, each measured alone (events on CUDA, perf_counter on the CPU)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            sync(device)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return times


def timed_once(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """(result, seconds) of one synchronised call: for warm-ups (compile, capture, cuDNN search)."""
    sync(device)
    t0 = time.perf_counter()
    result = fn()
    sync(device)
    return result, time.perf_counter() - t0


def summary(times_ms: list[float]) -> dict[str, float]:
    """Median, quartiles and relative IQR ((q75-q25)/median: run-to-run stability, lower is steadier)."""
    ordered = sorted(times_ms)
    med = statistics.median(ordered)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4, method="inclusive")
        q25, q75 = q[0], q[2]
    else:
        q25, q75 = ordered[0], ordered[-1]
    return {"median_ms": med, "q25_ms": q25, "q75_ms": q75, "rel_iqr": (q75 - q25) / med if med else 0.0,
            "min_ms": ordered[0], "max_ms": ordered[-1]}


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peaks(device: torch.device) -> dict[str, float | None]:
    """Peak allocated / reserved MiB since the last reset (None on the CPU: no allocator statistics)."""
    if device.type != "cuda":
        return {"peak_allocated_mib": None, "peak_reserved_mib": None}
    return {"peak_allocated_mib": torch.cuda.max_memory_allocated(device) / MiB,
            "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / MiB}
