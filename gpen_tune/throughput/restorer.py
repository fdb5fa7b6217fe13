"""The GPU stage's device work: uint8 crops in, restored uint8 crops out, one batch in flight while the next fills.

On CUDA the crops are copied into a pinned uint8 host buffer and uploaded with a non-blocking copy (a quarter
of the bytes of float32), normalised to [-1, 1] on the device, restored, converted back to uint8 on the device
and copied into a pinned output buffer without blocking; `submit` returns at once, `PendingBatch.result()` waits
for the copy. The runner gathers and uploads the next batch while the current one computes.

CUDA out-of-memory: the batch is split in halves (bucket sizes) and retried; the largest size that worked is
kept in `.limit` so later batches do not hit the wall again (the tune part's restorer may do the same: then it
never raises here and this is a no-op).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from gpen_tune.throughput.batching import BUCKETS, bucket_floor

RestoreFn = Callable[[torch.Tensor], torch.Tensor]


def is_oom(exc: BaseException) -> bool:
    """CUDA (or any torch) allocation failure, whatever the torch version calls it."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def to_model_input(u8_nhwc: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """[B,S,S,3] uint8 RGB (any device) -> [B,3,S,S] in [-1, 1], `dtype`, same device.

    The same arithmetic as the serial path (`gpen_tune.face.pipeline.crops_to_tensor`), so both feed the generator
    identical tensors."""
    return (u8_nhwc.permute(0, 3, 1, 2).to(dtype) / 127.5 - 1.0).contiguous()


def to_uint8_nhwc(out: torch.Tensor) -> torch.Tensor:
    """[B,3,S,S] generator output -> [B,S,S,3] uint8: clip((y + 1) / 2) * 255 rounded, as the serial path."""
    y = ((out.float() + 1.0) * 0.5).clamp_(0.0, 1.0).mul_(255.0).round_()
    return y.to(torch.uint8).permute(0, 2, 3, 1).contiguous()


@dataclass
class StageTimes:
    """Wall-clock seconds spent per activity of the GPU stage (CUDA-event time for the generator)."""

    upload_s: float = 0.0
    generator_s: float = 0.0        # CUDA-event time on CUDA, wall time on CPU
    download_wait_s: float = 0.0
    batches: int = 0
    faces: int = 0
    padded: int = 0
    oom_splits: int = 0
    batch_sizes: dict[int, int] = field(default_factory=dict)


class PendingBatch:
    """A submitted batch; `result()` waits for it and returns one restored crop per input."""

    def __init__(self, owner: CropRestorer, n: int, host: torch.Tensor | None, done: torch.cuda.Event | None,
                 events: tuple | None, ready: list[np.ndarray] | None = None, device_out: torch.Tensor | None = None,
                 finite: torch.Tensor | None = None, device_in: torch.Tensor | None = None):
        self._owner, self._n, self._host, self._done = owner, n, host, done
        self.submitted_at = time.perf_counter()
        self._events, self._ready, self._device_out = events, ready, device_out
        self._finite, self._device_in = finite, device_in

    def done(self) -> bool:
        """Whether the device has finished this batch (never blocks)."""
        return self._ready is not None or self._done is None or self._done.query()

    def result(self) -> list[np.ndarray]:
        if self._ready is not None:
            return self._ready
        t0 = time.perf_counter()
        self._done.synchronize()
        owner = self._owner
        owner.times.download_wait_s += time.perf_counter() - t0
        if self._events is not None:
            start, end = self._events
            owner.times.generator_s += start.elapsed_time(end) / 1000.0
        download = self._host is not None
        if self._finite is not None and not bool(self._finite):       # NaN guard tripped: fp32 re-run, in order
            self._device_out = owner._recover(self._device_in)
            host = self._device_out.cpu().numpy() if download else None
        else:
            host = self._host[: self._n].numpy() if download else None
        # the pinned buffer is reused by a later batch: copy out of it
        self._ready = [host[i].copy() for i in range(self._n)] if download else [None] * self._n
        self._host = self._finite = self._device_in = None
        return self._ready

    @property
    def device_out(self) -> torch.Tensor | None:
        """[n,S,S,3] uint8 on the device (GPU paste-back reads it there), None on the CPU."""
        return self._device_out


class CropRestorer:
    """Runs a `restore` callable on uint8 crop batches with GPU-side conversion and OOM splitting.

    Args:
        restore: [B,3,S,S] float in [-1,1] on `device` -> [B,3,S,S]; e.g. a FullGenerator or the tune part's
            `build_restorer(...)` result.
        device: where `restore` runs.
        size: crop side S.
        max_batch: the largest batch ever submitted (rounded down to a bucket).
        dtype: the input dtype, as the serial path makes it (the model's compute dtype).
        timed: CUDA-event timing of every generator call (for the GPU busy fraction).
    """

    def __init__(self, restore: RestoreFn, device: str | torch.device, size: int, max_batch: int = 32,
                 dtype: torch.dtype = torch.float32, timed: bool = True):
        self.restore = restore
        self.dtype = dtype
        self.device = torch.device(device)
        self.size = size
        self.limit = bucket_floor(max_batch)
        self.times = StageTimes()
        self.cuda = self.device.type == "cuda"
        self.timed = timed
        self._lock = threading.Lock()
        if self.cuda:
            shape = (self.limit, size, size, 3)
            self._in = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._out = [torch.empty(shape, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
            self._flag = [torch.ones((), dtype=torch.bool, pin_memory=True) for _ in range(2)]
            self._in_free = [None, None]   # event after which each input buffer may be rewritten
            self._slot = 0

    # -- public -------------------------------------------------------------------------------------------------
    def submit(self, crops: Sequence[np.ndarray | torch.Tensor], download: bool = True) -> PendingBatch:
        """Start restoring `crops` (each [S,S,3] uint8 RGB); at most one earlier batch should still be pending.

        On CUDA a crop may be a device tensor already (cut on the GPU; its producer has synchronized), and
        `download=False` leaves the results on the device only (`result()` then gives None per crop: read
        `device_out`)."""
        n = len(crops)
        t0 = time.perf_counter()
        if n == 0:
            return PendingBatch(self, 0, None, None, None, ready=[])
        if n > self.limit:
            raise ValueError(f"batch of {n} exceeds the current limit {self.limit}")
        self.times.batches += 1
        self.times.faces += n
        self.times.batch_sizes[n] = self.times.batch_sizes.get(n, 0) + 1
        batch = self._submit_cpu(crops) if not self.cuda else self._submit_cuda(crops, download)
        batch.submitted_at = t0
        return batch

    def __call__(self, crops: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Restore any number of crops synchronously, in bucket-sized batches."""
        out: list[np.ndarray] = []
        i = 0
        while i < len(crops):
            b = bucket_floor(len(crops) - i, self.limit)
            out.extend(self.submit(crops[i: i + b]).result())
            i += b
        return out

    # -- CPU ----------------------------------------------------------------------------------------------------
    def _submit_cpu(self, crops: Sequence[np.ndarray | torch.Tensor]) -> PendingBatch:
        t0 = time.perf_counter()
        x = to_model_input(torch.stack([torch.as_tensor(c) for c in crops]), self.dtype)
        t1 = time.perf_counter()
        with torch.inference_mode():
            y, _ = self._restore_split(x)
        t2 = time.perf_counter()
        out = to_uint8_nhwc(y).numpy()
        self.times.upload_s += t1 - t0
        self.times.generator_s += t2 - t1
        return PendingBatch(self, len(crops), None, None, None, ready=[out[i] for i in range(len(crops))])

    # -- CUDA ---------------------------------------------------------------------------------------------------
    def _upload(self, crops: Sequence[np.ndarray], slot: int, stream: torch.cuda.Stream) -> torch.Tensor:
        """Host crops through the slot's pinned buffer to the device, without blocking."""
        if self._in_free[slot] is not None:
            self._in_free[slot].synchronize()            # the upload from two batches ago has finished
        host_in = self._in[slot]
        view = host_in.numpy()
        for i, c in enumerate(crops):
            view[i] = c
        dev_u8 = host_in[: len(crops)].to(self.device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(stream)
        self._in_free[slot] = copied
        return dev_u8

    def _submit_cuda(self, crops: Sequence[np.ndarray | torch.Tensor], download: bool = True) -> PendingBatch:
        n = len(crops)
        slot = self._slot
        self._slot ^= 1
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream(self.device)
        if all(isinstance(c, torch.Tensor) and c.device == self.device for c in crops):
            dev_u8 = torch.stack(list(crops))            # cut on the GPU: one gather, no host copies
        elif any(isinstance(c, torch.Tensor) for c in crops):
            dev_u8 = torch.stack([torch.as_tensor(c).to(self.device) for c in crops])
        else:
            dev_u8 = self._upload(crops, slot, stream)
        start = torch.cuda.Event(enable_timing=True) if self.timed else None
        end = torch.cuda.Event(enable_timing=True) if self.timed else None
        with torch.inference_mode():
            x = to_model_input(dev_u8, self.dtype)
            if start is not None:
                start.record(stream)
            y, finite = self._restore_split(x, deferred=True)
            if end is not None:
                end.record(stream)
            dev_out = to_uint8_nhwc(y)
        host_out = self._out[slot] if download else None
        if host_out is not None:
            host_out[:n].copy_(dev_out, non_blocking=True)
        flag = None
        if finite is not None:                           # the NaN guard, read when the batch is collected
            flag = self._flag[slot]
            flag.copy_(finite, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
        self.times.upload_s += time.perf_counter() - t0
        return PendingBatch(self, n, host_out, done, (start, end) if start is not None else None,
                            device_out=dev_out, finite=flag, device_in=dev_u8 if flag is not None else None)

    def _recover(self, dev_u8: torch.Tensor) -> torch.Tensor:
        """Run a batch whose deferred finite check failed through the restore callable's fp32 recovery."""
        with torch.inference_mode():
            return to_uint8_nhwc(self.restore.recover(to_model_input(dev_u8, self.dtype)))

    # -- OOM split ----------------------------------------------------------------------------------------------
    def _restore_split(self, x: torch.Tensor, deferred: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(restored batch, device finite flag or None); `deferred` asks the restore callable not to sync."""
        n = x.shape[0]
        try:
            y, finite = call_deferred(self.restore, x) if deferred else (self.restore(x), None)
            inner = getattr(self.restore, "max_batch", None)     # the tune part's Restorer splits OOM itself
            if isinstance(inner, int) and inner < self.limit:
                self.limit = bucket_floor(inner)
            return y, finite
        except Exception as exc:
            if not is_oom(exc) or n == 1:
                raise
        # out of memory: keep half as the new limit and run the batch in chunks of the (maybe lower again) limit
        self.limit = min(self.limit, bucket_floor(max(1, n // 2)))
        self.times.oom_splits += 1
        if self.cuda:
            torch.cuda.empty_cache()
        parts, i = [], 0
        while i < n:
            b = min(self.limit, n - i)
            parts.append(self._restore_split(x[i: i + b], deferred))
            i += b
        return join_parts(parts)


class FixedBatch:
    """Pads every batch to `batch` rows (zeros) and returns the rows asked for: one input shape only.

    With torch.compile or CUDA graphs every new batch size costs a compile or a capture; a run that pads its
    tail batches pays one. Used by the benchmark for both the serial and the pipelined path."""

    def __init__(self, restore: RestoreFn, batch: int):
        self.restore = restore
        self.batch = batch

    @property
    def max_batch(self) -> int | None:
        return getattr(self.restore, "max_batch", None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_deferred(x, deferred=False)[0]

    def forward_deferred(self, x: torch.Tensor, deferred: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        n = x.shape[0]
        if n > self.batch:
            return join_parts([self.forward_deferred(c, deferred) for c in x.split(self.batch)])
        if n < self.batch:
            x = torch.cat([x, x.new_zeros((self.batch - n, *x.shape[1:]))])
        y, finite = call_deferred(self.restore, x) if deferred else (self.restore(x), None)
        return y[:n], finite

    def recover(self, x: torch.Tensor) -> torch.Tensor:
        return self.restore.recover(x)


def join_parts(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The (output, finite flag) of a batch run in parts: outputs concatenated, flags and-ed (None if none)."""
    flags = [f for _, f in parts if f is not None]
    return torch.cat([y for y, _ in parts]), torch.stack(flags).all() if flags else None


def call_deferred(restore: RestoreFn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(restore(x), finite flag or None) through `restore.forward_deferred` when it has one (the tune part's
    Restorer and the wrappers around it), else a plain call with no flag."""
    fn = getattr(restore, "forward_deferred", None)
    return fn(x) if fn is not None else (restore(x), None)


def default_max_batch(device: torch.device | str) -> int:
    """32 on CUDA (GPEN-512 bs32 fits a few GiB in half precision), 4 on the CPU (bigger batches gain nothing)."""
    return 32 if torch.device(device).type == "cuda" else 4


__all__ = ["BUCKETS", "CropRestorer", "FixedBatch", "PendingBatch", "StageTimes", "default_max_batch", "is_oom",
           "to_model_input", "to_uint8_nhwc"]
