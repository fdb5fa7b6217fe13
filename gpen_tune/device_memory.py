"""The memory this process may use on a CUDA device: the device's free and total bytes, capped by torch's
per-process memory fraction (`torch.cuda.set_per_process_memory_fraction`: how a GPU is shared between
processes, and how a 4 GiB card is emulated on a big one). Every memory-sized choice reads it here: the `auto`
preset, the detector's images per call and P-Net graphs, the lazy detector's release."""

from __future__ import annotations

import ctypes
import ctypes.util

import torch


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _fraction(index: int) -> float:
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)   # torch >= 2.6
    return float(getter(index)) if getter is not None else 1.0


def cuda_memory(device: str | torch.device) -> tuple[int, int] | None:
    """(free, total) bytes this process may still use / use at most on a CUDA `device`; None off CUDA.

    total = the card's memory x the per-process fraction; free = min(the card's free memory, total - what this
    process's allocator has reserved)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = _index(device)
    free, card = torch.cuda.mem_get_info(index)
    fraction = _fraction(index)
    total = int(card * fraction)
    if fraction < 1.0:
        free = min(free, max(0, total - torch.cuda.memory_reserved(index)))
    return int(free), total


def cuda_total(device: str | torch.device) -> int | None:
    """The bytes this process may use at most on a CUDA `device` (no allocation, no CUDA context needed beyond
    the device's properties); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = _index(device)
    card = torch.cuda.get_device_properties(index).total_memory
    return int(card * _fraction(index))


def trim_host_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim; a no-op elsewhere). glibc keeps the
    memory of freed tensors for reuse, so building the CPU pipeline (fp32 weights read, then cast to bf16) left
    ~45 MB resident that the run never reused (GPEN-BFR-256 on the Solvay photo)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):   # not glibc (macOS, musl without it, Windows)
        return
    trim(0)
