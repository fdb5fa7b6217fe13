"""One batch in flight on CUDA: pinned uint8 host buffers (two slots), the submitted batch's handle, stage timings.

The crops are copied into a pinned buffer and uploaded without blocking; the restored uint8 batch is copied back
into the other pinned buffer without blocking; `PendingBatch.result()` waits for that copy. While one slot's batch
computes the caller fills the other.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
import torch


@dataclass
class StageTimes:
    """Wall-clock seconds per activity of the generator stage (CUDA-event time for the generator on CUDA)."""

    upload_s: float = 0.0
    generator_s: float = 0.0        # CUDA-event time on CUDA, wall time on CPU
    download_wait_s: float = 0.0
    batches: int = 0
    faces: int = 0
    padded: int = 0
    oom_splits: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)
    first_submit_at: float | None = None     # perf_counter of the first batch's submit and the last one's collection:
    last_done_at: float | None = None        # the span the generator's busy share is taken over

    def span_s(self) -> float | None:
        if self.first_submit_at is None or self.last_done_at is None:
            return None
        return max(0.0, self.last_done_at - self.first_submit_at)


def gather_rows(crops: Sequence[np.ndarray], out: torch.Tensor) -> torch.Tensor:
    """The [S,S,3] uint8 crops copied into out[:n] (a contiguous host tensor) by one call, and out[:n].

    Each copy that gives up the GIL must win it back behind every other thread that wants it; one call for the
    batch instead of one per crop keeps a generator call's host work from growing with its faces under load
    (benchmarks/staging_gil.py). OpenCV's vconcat copies on the calling thread with the GIL released once, where a
    torch copy would start its intra-op threads, which wait on busy cores."""
    n = len(crops)
    rows = out[:n]
    view = rows.numpy().reshape(n * rows.shape[1], *rows.shape[2:])
    got = cv2.vconcat(list(crops), dst=view)             # into `view` while the crops fill it exactly
    if got.ctypes.data != view.ctypes.data:
        raise ValueError(f"crops of shapes {sorted({c.shape for c in crops})} do not fill rows of {tuple(rows.shape)}")
    return rows


def split_rows(rows: torch.Tensor, n: int) -> list[np.ndarray]:
    """The first n rows of a reused host buffer as n arrays, copied out in one call (views of one copy)."""
    return list(rows[:n].numpy().copy())


class PinnedStaging:
    """Two slots of pinned [capacity,S,S,3] uint8 input/output buffers and a pinned per-face finite flag row."""

    def __init__(self, capacity: int, size: int):
        shape = (capacity, size, size, 3)
        self.capacity, self.size = capacity, size
        self.inputs = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.outputs = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        self.flags = [torch.ones(capacity, dtype=torch.bool, pin_memory=True) for _ in range(2)]
        self.input_free: list[torch.cuda.Event | None] = [None, None]   # after it, the slot's input is rewritable
        self.slot = 0

    def fits(self, n: int, size: int) -> bool:
        return n <= self.capacity and size == self.size

    def next_slot(self) -> int:
        slot, self.slot = self.slot, self.slot ^ 1
        return slot

    def upload(self, crops: Sequence[np.ndarray], slot: int, device: torch.device) -> torch.Tensor:
        """Host crops through the slot's pinned buffer to the device, without blocking."""
        free = self.input_free[slot]
        if free is not None:
            free.synchronize()                       # the upload from two batches ago has finished
        dev = gather_rows(crops, self.inputs[slot]).to(device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(device))
        self.input_free[slot] = copied
        return dev


class PendingBatch:
    """A submitted batch; `result()` waits for it and returns one restored crop per input (in input order).

    `finish(host_out, host_flags) -> host_out` runs once at collection on the owner's side: it reads the per-face
    finite flags (downloaded with the batch, no extra sync) and repairs or counts the non-finite faces."""

    def __init__(self, n: int, *, ready: list[np.ndarray | None] | None = None, done: torch.cuda.Event | None = None,
                 host_out: torch.Tensor | None = None, host_flags: torch.Tensor | None = None,
                 device_out: torch.Tensor | None = None, events: tuple | None = None,
                 finish: Callable[[PendingBatch], None] | None = None, times: StageTimes | None = None):
        self.n = n
        self.submitted_at = time.perf_counter()
        self._ready, self._done, self._host_out, self._host_flags = ready, done, host_out, host_flags
        self._device_out, self._events, self._finish, self._times = device_out, events, finish, times

    def done(self) -> bool:
        """Whether the device has finished this batch (never blocks)."""
        return self._ready is not None or self._done is None or self._done.query()

    @property
    def device_out(self) -> torch.Tensor | None:
        """[n,S,S,3] uint8 on the device (a GPU paste reads it there); on the CPU the same data on the host."""
        return self._device_out

    @property
    def host_flags(self) -> torch.Tensor | None:
        return self._host_flags

    @property
    def downloads(self) -> bool:
        """Whether `result()` hands back host crops (submitted with download=True)."""
        return self._host_out is not None

    def result(self) -> list[np.ndarray | None]:
        """The restored crops (None per crop when submitted with download=False: read `device_out`)."""
        if self._ready is not None:
            return self._ready
        t0 = time.perf_counter()
        if self._done is not None:
            self._done.synchronize()
        if self._times is not None:
            self._times.last_done_at = time.perf_counter()
            self._times.download_wait_s += self._times.last_done_at - t0
            if self._events is not None:
                start, end = self._events
                self._times.generator_s += start.elapsed_time(end) / 1000.0
        if self._finish is not None:
            self._finish(self)                        # may replace device_out / host_out (fp32 re-run)
        host = self._host_out
        # the pinned buffer is reused by a later batch: copy out of it
        self._ready = split_rows(host, self.n) if host is not None else [None] * self.n
        self._host_out = self._host_flags = self._finish = None
        return self._ready

    def replace(self, device_out: torch.Tensor, host_out: torch.Tensor | None) -> None:
        """New contents for this batch (the owner's fp32 re-run)."""
        self._device_out, self._host_out = device_out, host_out
