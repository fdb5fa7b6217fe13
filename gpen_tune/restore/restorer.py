"""`Restorer`: the generator behind every enabled switch, with batching, OOM splitting and the non-finite guard.

It owns the batch policy: one limit (`.limit`, the largest batch run at once; the runner rounds it to a bucket of
`buckets.BUCKETS`; lowered to a bucket for good when CUDA runs out of memory), one splitter, and the choice of how
many pending faces to launch (`take`: bucket sizes, or up to the limit for a forward padded to one shape).
Guards of every batch:
* CUDA out-of-memory -> the limit drops to half (a bucket), CUDA graphs are dropped, the batch runs in chunks of
  the new limit; recorded in `fallbacks`;
* non-finite output: one reduction per batch gives a finite flag per face (read with the batch's download, no
  extra host sync). With --amp a batch with a non-finite face is re-run in fp32 first (original weights); a face
  still non-finite in fp32 (e.g. a checkpoint full of NaN) gets its INPUT crop back unchanged, is counted in
  `nonfinite_faces` and recorded once in `fallbacks`;
* cuDNN's benchmark mode can reserve tens of GB while it tries algorithms on the first call of each shape (67 GB
  on an H200): CUDNN_CONV_WSCAP_DBG (cuDNN's workspace cap, MiB) is set to CUDNN_WORKSPACE_CAP_MIB unless the
  user set it, and after the first call of every input shape the allocator's unused cache is returned.
On CUDA `submit` is asynchronous (pinned staging, one batch in flight while the next fills); elsewhere inline.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from gpen_tune.device_memory import cuda_total
from gpen_tune.model.io import keep_input_where, stack_crops, to_model_input, to_uint8_nhwc
from gpen_tune.restore import buckets
from gpen_tune.restore.buckets import BUCKETS, bucket_floor
from gpen_tune.restore.staging import PendingBatch, PinnedStaging, StageTimes
from gpen_tune.tune.amp import Fp32Reserve
from gpen_tune.tune.apply import apply_switches
from gpen_tune.tune.cuda_graph import settle
from gpen_tune.tune.oom import is_out_of_memory
from gpen_tune.tune.options import TuneConfig

CUDNN_WORKSPACE_CAP_MIB = 4096
Forward = Callable[[torch.Tensor], torch.Tensor]
Crop = np.ndarray | torch.Tensor


class Restorer:
    """A forward ([B,3,S,S] in [-1,1] -> [B,3,S,S]) behind the guards above; uint8 crops in and out.

    Args:
        forward: the composed callable (e.g. graphs over compiled over cast model, or a plain FullGenerator).
        device: where it runs (default CPU); dtype: the input dtype it wants (the model's compute dtype).
        size: crop side S (None: taken from each batch).
        max_batch: the starting limit (None: the largest bucket). Kept as given, so a serial caller's batch runs
            as one call; the folder runner rounds it down to a bucket; an OOM lowers it to a bucket.
        model, cfg, reserve: the (cast) generator, the TuneConfig asked for and the fp32 weights for the re-run.
        one_shape: pad every crop batch to `limit` rows (a compiled forward: one compile instead of one per
            bucket); `take` then launches up to the limit at once. The tensor-level `__call__` never pads.
            `pad_to_buckets` (set by an owner that warms every bucket first, as the service does) pads to the
            smallest bucket that holds the batch instead: a lone face then costs a batch of 1, not of the limit.
        timed: CUDA-event timing of every generator call (the runner's GPU busy fraction).
    Report fields: effective (cfg with skipped switches off), fallbacks, notes, skipped, warmup_seconds,
    warmup_reserved_bytes, fp32_reruns, nonfinite_faces, times (StageTimes).
    """

    def __init__(self, forward: Forward, *, device: str | torch.device | None = None,
                 dtype: torch.dtype = torch.float32, size: int | None = None, max_batch: int | None = None,
                 model: nn.Module | None = None, cfg: TuneConfig | None = None, reserve: Fp32Reserve | None = None,
                 one_shape: bool = False, timed: bool = True):
        self.forward = forward
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.dtype = dtype
        self.size = size
        self.limit = max(1, max_batch) if max_batch else BUCKETS[-1]
        self.model = model
        self.cfg = cfg or TuneConfig()
        self.effective = self.cfg
        self.reserve = reserve
        self.one_shape = one_shape
        self.pad_to_buckets = False            # with one_shape: pad to the bucket that holds a batch, not the limit
        self.timed = timed
        self.times = StageTimes()
        self.fallbacks: list[str] = []
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}
        self.warmup_seconds: dict[tuple, float] = {}
        self.warmup_reserved_bytes = 0
        self.fp32_reruns = 0
        self.nonfinite_faces = 0
        self._staging: PinnedStaging | None = None

    @property
    def max_batch(self) -> int:
        """The current limit (read-only name kept for reports)."""
        return self.limit

    def record(self, msg: str) -> None:
        self.fallbacks.append(msg)

    def take(self, n: int, limit: int | None = None) -> int:
        """How many of n pending faces to launch now (bucket policy; `limit` defaults to `.limit`)."""
        return buckets.take(n, self.limit if limit is None else min(limit, self.limit), self.one_shape)

    # -- tensor level -------------------------------------------------------------------------------------------
    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """[B,3,S,S] in [-1,1] -> [B,3,S,S] fp32, guarded (one host sync for the finite check)."""
        if batch.dim() != 4 or batch.shape[1] != 3:
            raise ValueError(f"restore expects a [B,3,S,S] batch, got {tuple(batch.shape)}")
        if batch.device != self.device:
            batch = batch.to(self.device)
        with torch.no_grad():
            y, finite = self._run(batch, pad=False)
            if not bool(finite.all()):
                if self.reserve is not None:
                    y, finite = self._rerun_fp32(batch)
                y = torch.where(finite.view(-1, 1, 1, 1), y, batch.float())
                self._count_nonfinite(finite)
        return y

    def warmup(self, batch_sizes: tuple[int, ...], size: int, dtype: torch.dtype | None = None) -> None:
        """Run each batch size once on zeros so compile/capture/cuDNN search happen now, not on the first image."""
        for bs in batch_sizes:
            self(torch.zeros(bs, 3, size, size, device=self.device, dtype=dtype or self.dtype))

    # -- crop level ---------------------------------------------------------------------------------------------
    def restore_crops(self, crops: Sequence[Crop]) -> np.ndarray:
        """[S,S,3] uint8 RGB crops (host arrays or device tensors) -> restored [B,S,S,3] uint8, synchronously."""
        out: list[np.ndarray] = []
        i = 0
        while i < len(crops):
            b = min(len(crops) - i, self.limit)
            out.extend(self.submit(crops[i: i + b]).result())
            i += b
        if not out:
            s = self.size or 0
            return np.empty((0, s, s, 3), dtype=np.uint8)
        return np.stack(out)

    def submit(self, crops: Sequence[Crop], download: bool = True) -> PendingBatch:
        """Start restoring at most `limit` crops; at most one earlier batch should still be pending.

        On CUDA a crop may be a device tensor already (cut on the GPU; its producer has synchronized), and
        `download=False` leaves the results on the device only (`result()` then gives None per crop: read
        `device_out`). Elsewhere the batch runs before this returns."""
        n = len(crops)
        t0 = time.perf_counter()
        if n == 0:
            return PendingBatch(0, ready=[])
        if n > self.limit:
            raise ValueError(f"batch of {n} exceeds the current limit {self.limit}")
        self.times.batches += 1
        if self.times.first_submit_at is None:
            self.times.first_submit_at = t0
        self.times.faces += n
        self.times.batch_sizes[n] = self.times.batch_sizes.get(n, 0) + 1
        batch = self._submit_cuda(crops, download) if self.device.type == "cuda" else self._submit_inline(crops)
        batch.submitted_at = t0
        return batch

    def _submit_inline(self, crops: Sequence[Crop]) -> PendingBatch:
        t0 = time.perf_counter()
        dev_u8 = stack_crops(crops, self.device)
        x = to_model_input(dev_u8, self.dtype)
        t1 = time.perf_counter()
        with torch.inference_mode():
            y, finite = self._run(x, pad=self.one_shape)
            out = keep_input_where(finite, to_uint8_nhwc(y), dev_u8)
            if not bool(finite.all()):
                out, finite = self._repair(dev_u8, out, finite)
        self.times.upload_s += t1 - t0
        self.times.generator_s += time.perf_counter() - t1
        host = out.cpu().numpy()
        self.times.last_done_at = time.perf_counter()
        return PendingBatch(len(crops), ready=[host[i] for i in range(len(crops))], device_out=out)

    def _submit_cuda(self, crops: Sequence[Crop], download: bool) -> PendingBatch:
        n = len(crops)
        t0 = time.perf_counter()
        stream = torch.cuda.current_stream(self.device)
        staging = self._staging_for(n, crops[0].shape[0])
        slot = staging.next_slot()
        if all(isinstance(c, torch.Tensor) and c.device == self.device for c in crops):
            dev_u8 = torch.stack(list(crops))            # cut on the GPU: one gather, no host copies
        elif any(isinstance(c, torch.Tensor) for c in crops):
            dev_u8 = stack_crops(crops, self.device)
        else:
            dev_u8 = staging.upload(crops, slot, self.device)
        events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if self.timed else None
        with torch.inference_mode():
            x = to_model_input(dev_u8, self.dtype)
            if events is not None:
                events[0].record(stream)
            y, finite = self._run(x, pad=self.one_shape)
            if events is not None:
                events[1].record(stream)
            out = keep_input_where(finite, to_uint8_nhwc(y), dev_u8)
        host_out = staging.outputs[slot][:n] if download else None
        if host_out is not None:
            host_out.copy_(out, non_blocking=True)
        host_flags = staging.flags[slot][:n]
        host_flags.copy_(finite, non_blocking=True)       # the finite flags, read when the batch is collected
        done = torch.cuda.Event()
        done.record(stream)
        self.times.upload_s += time.perf_counter() - t0
        return PendingBatch(n, done=done, host_out=host_out, host_flags=host_flags, device_out=out, events=events,
                            finish=functools.partial(self._collect, dev_u8), times=self.times)

    def _staging_for(self, n: int, size: int) -> PinnedStaging:
        if self._staging is None or not self._staging.fits(max(n, self.limit), size):
            self._staging = PinnedStaging(max(n, self.limit), size)
        return self._staging

    def _collect(self, dev_u8: torch.Tensor, batch: PendingBatch) -> None:
        """At `result()`: a batch with a non-finite face is repaired (fp32 re-run / input kept) in input order."""
        flags = batch.host_flags
        if flags is None or bool(flags.all()):
            return
        with torch.inference_mode():
            out, _ = self._repair(dev_u8, batch.device_out, flags.to(self.device))
        batch.replace(out, out.cpu() if batch.downloads else None)

    def _repair(self, dev_u8: torch.Tensor, out_u8: torch.Tensor, finite: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """A crop batch with a non-finite face: the fp32 re-run (amp), then the input kept for what stays bad."""
        if self.reserve is not None:
            y, finite = self._rerun_fp32(to_model_input(dev_u8, torch.float32))
            out_u8 = keep_input_where(finite, to_uint8_nhwc(y), dev_u8)
        self._count_nonfinite(finite)
        return out_u8, finite

    # -- the generator calls ------------------------------------------------------------------------------------
    def _run(self, x: torch.Tensor, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(y fp32, per-face finite flags on the device) in chunks of the limit; an OOM lowers it and retries."""
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        i, n = 0, x.shape[0]
        while i < n:
            b = min(self.limit, n - i)
            try:
                parts.append(self._forward_once(x[i: i + b], pad))
            except Exception as exc:
                if not is_out_of_memory(exc) or b == 1:
                    raise
                self._after_oom(b)
                continue
            i += b
        if len(parts) == 1:
            return parts[0]
        return torch.cat([y for y, _ in parts]), torch.cat([f for _, f in parts])

    def padded_size(self, n: int) -> int:
        """The rows a padded batch of n runs as: the limit, or with `pad_to_buckets` the smallest bucket >= n (the
        limit at most)."""
        if self.pad_to_buckets and n <= BUCKETS[-1]:
            return min(buckets.bucket_ceil(n), self.limit)
        return max(n, self.limit)

    def _forward_once(self, x: torch.Tensor, pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        rows = self.padded_size(n) if pad else n
        if rows > n:
            x = torch.cat([x, x.new_zeros((rows - n, *x.shape[1:]))])
            self.times.padded += rows - n
        key = (x.shape[0], tuple(x.shape[1:]), x.dtype)
        first = key not in self.warmup_seconds
        start = time.perf_counter() if first else 0.0
        y = self.forward(x)
        if first:
            self._end_warmup(key, start, x.device)
        y = y[:n].float()
        return y, finite_per_face(y)

    def _after_oom(self, n: int) -> None:
        self.limit = min(self.limit, bucket_floor(max(1, n // 2)))
        self.times.oom_splits += 1
        self.record(f"out of memory at batch {n}: running batches of at most {self.limit} from now on")
        reset = getattr(self.forward, "reset", None)
        if callable(reset):
            reset()                                       # CUDA graphs of the failed size
        settle(sync=False)

    def _end_warmup(self, key: tuple, start: float, device: torch.device) -> None:
        if device.type == "cuda":
            settle(device, free=False)
            self.warmup_reserved_bytes = max(self.warmup_reserved_bytes, torch.cuda.memory_reserved(device))
            settle(sync=False)        # return what cuDNN's algorithm search left in the cache
        self.warmup_seconds[key] = time.perf_counter() - start

    def _rerun_fp32(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fp32 = self.reserve.fp32_model(self.model)
        y = torch.cat([fp32(c.float()).float() for c in x.split(self.limit)])
        finite = finite_per_face(y)
        self.fp32_reruns += 1
        how = "original fp32 weights" if self.reserve.exact else "up-cast half weights (no fp32 originals kept)"
        ok = "finite" if bool(finite.all()) else "still non-finite"
        self.record(f"non-finite {self.effective.amp} output for a batch of {x.shape[0]}: re-ran it in fp32 "
                    f"({how}): {ok}")
        return y, finite

    def _count_nonfinite(self, finite: torch.Tensor) -> None:
        bad = int((~finite).sum())
        if bad and self.nonfinite_faces == 0:
            self.record("non-finite generator output in fp32 (NaN/inf weights?): those faces keep their input "
                        "crop unchanged (count: nonfinite_faces)")
        self.nonfinite_faces += bad


def finite_per_face(y: torch.Tensor) -> torch.Tensor:
    """[B] bool on y's device: whether every element of each face is finite, from one fp32 sum per face.

    The sum is NaN/inf whenever any element is; it can also overflow for finite elements near the fp32 limit,
    which only sends an output that is garbage anyway to the fp32 re-run / the input crop."""
    return torch.isfinite(y.sum(dim=tuple(range(1, y.dim())), dtype=torch.float32))


def bound_cudnn_workspace(device: torch.device, cap_mib: int = CUDNN_WORKSPACE_CAP_MIB) -> None:
    """Cap cuDNN's per-algorithm workspace unless the user chose a cap; cuDNN reads it when it tries algorithms.
    Below 64 GiB of memory for this process the cap is 1/64 of it (a 4 GiB card: 64 MiB; GPEN-512's convs took
    2 x 64 MiB at the 4 GiB mode's peak, benchmarks/results/20261202-010124_low_memory_low-memory.json)."""
    total = cuda_total(device)
    if total is not None and total < 64 * 2**30:
        cap_mib = min(cap_mib, max(16, total // 64 // 2**20))
    os.environ.setdefault("CUDNN_CONV_WSCAP_DBG", str(cap_mib))


def build_restorer(model: nn.Module, cfg: TuneConfig | None = None, *, device: str | torch.device | None = None,
                   max_batch: int | None = None, timed: bool = True,
                   compile_backend: str | Callable = "inductor") -> Restorer:
    """Apply cfg's switches to `model` (modified in place: cast, flags) and return the guarded Restorer.

    Args:
        model: a FullGenerator in eval mode (load_model); moved to `device` if it is elsewhere.
        cfg: the switches; None = all off (fp32 eager).
        device: where it runs; default = where the model's parameters are.
        max_batch: the starting limit (None: the largest bucket; the pipeline passes its batch size).
        timed: CUDA-event timing per batch (StageTimes.generator_s).
        compile_backend: torch.compile backend; anything but "inductor" is for tests.
    A compiled or graph-replayed forward pads crop batches to one shape (`one_shape`): each new batch shape costs
    its own warm-up (a compile; a first eager call and a capture, 1.2-2.1 s each on an H200, warm caches), which
    six bucket sizes paid six times in a folder or a video, for bucket padding saved the GPU far less.
    """
    cfg = cfg or TuneConfig()
    device = torch.device(device if device is not None else next(model.parameters()).device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model = model.to(device).eval().requires_grad_(False)
    if cfg.backend == "onnxruntime":                  # the same Restorer around ONNX Runtime instead of the module
        from gpen_tune.restore.onnx_backend import onnx_forward

        ort = onnx_forward(model, cfg, device=device)
        restorer = Restorer(ort.forward, device="cpu", dtype=torch.float32, size=model.size, max_batch=max_batch,
                            model=model, cfg=cfg)
        restorer.skipped, restorer.effective, restorer.notes = ort.skipped, ort.effective, ort.notes
        restorer.fallbacks = [f"{name} skipped: {why}" for name, why in ort.skipped.items()]
        return restorer
    if device.type == "cuda":
        bound_cudnn_workspace(device)
    done = apply_switches(model, cfg, device, BUCKETS, compile_backend=compile_backend)
    restorer = Restorer(done.forward, device=device, dtype=getattr(done.model, "compute_dtype", torch.float32),
                        size=getattr(done.model, "size", None), max_batch=max_batch, model=done.model, cfg=cfg,
                        reserve=done.reserve, one_shape=bool(done.effective.compile or done.effective.cuda_graph),
                        timed=timed)
    restorer.fallbacks = done.log                 # the switches keep reporting later fallbacks into it
    restorer.notes, restorer.skipped, restorer.effective = done.notes, done.skipped, done.effective
    return restorer


def as_restorer(restore: Forward | Restorer, *, device: str | torch.device, dtype: torch.dtype = torch.float32,
                size: int | None = None, max_batch: int | None = None) -> Restorer:
    """`restore` if it is a Restorer already, else a Restorer around the plain callable (no switches)."""
    if isinstance(restore, Restorer):
        return restore
    return Restorer(restore, device=device, dtype=dtype, size=size, max_batch=max_batch)
