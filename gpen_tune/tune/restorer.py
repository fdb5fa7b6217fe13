"""`build_restorer`: apply the switches of a TuneConfig to a generator in one fixed order; return the callable the
pipeline runs faces through.

Order (options.APPLY_ORDER): act_checkpoint -> amp -> fused -> compile -> cuda_graph; lazy_detector and face_crop
act on the pipeline (`lazy_detector.apply`, `face_crop.apply`) and are only checked here. A switch that is not
supported on the device is skipped with its reason (`.skipped`, also logged in `.fallbacks`).

The returned `Restorer` is `restore(batch [B,3,S,S] in [-1,1] on the model's device) -> [B,3,S,S] fp32`, under
no_grad, and guards every call:
* non-finite output with --amp -> that batch is re-run in fp32 (original weights), recorded;
* CUDA out-of-memory -> the batch is split in halves (recursively), the working limit `max_batch` remembered for
  later calls, CUDA graphs of the failed size dropped, recorded;
* cuDNN benchmark mode can reserve tens of GB while it tries algorithms on the first call of each shape
  (measured.md: 67 GB on an H200). We bound and release it: CUDNN_CONV_WSCAP_DBG (cuDNN's workspace cap, MiB) is
  set to CUDNN_WORKSPACE_CAP_MIB unless the user set it, and after the first call of every new input shape the
  allocator's unused cache is returned (torch.cuda.empty_cache), so the steady-state reserved pool is what the
  generator really needs. `warmup_reserved_bytes` records the largest reserved pool seen before a release.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from gpen_tune.tune import act_checkpoint, amp, cuda_graph, face_crop, fused, lazy_detector, torch_compile
from gpen_tune.tune.options import APPLY_ORDER, TuneConfig
from gpen_tune.tune.torch_compile import is_out_of_memory

CUDNN_WORKSPACE_CAP_MIB = 4096

SWITCH_MODULES = {
    "act_checkpoint": act_checkpoint,
    "amp": amp,
    "fused": fused,
    "compile": torch_compile,
    "cuda_graph": cuda_graph,
    "lazy_detector": lazy_detector,
    "face_crop": face_crop,
}
_OFF = {"act_checkpoint": False, "amp": "off", "fused": False, "compile": None, "cuda_graph": False,
        "lazy_detector": False, "face_crop": False}


class Restorer:
    """The generator behind all enabled switches, with NaN -> fp32 and OOM -> smaller batch guards.

    Attributes:
        forward: the innermost-to-outermost composed callable (graphs over compiled over cast model).
        model: the (cast) FullGenerator the switches were applied to.
        cfg: the requested TuneConfig; `effective`: what actually runs (skipped switches off).
        fallbacks: human-readable log of every fallback and skip, in order.
        notes: how switches composed (e.g. no manual graph capture under a compile mode that has its own).
        skipped: switch name -> reason it was not applied.
        max_batch: largest batch run in one call (None = no limit yet); lowered by OOM splitting.
        warmup_seconds: wall time of the first call per input shape (compile / capture / cuDNN search).
    """

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], model: nn.Module | None = None,
                 cfg: TuneConfig | None = None, device: str | torch.device | None = None,
                 reserve: amp.Fp32Reserve | None = None, max_batch: int | None = None):
        self.forward = forward
        self.model = model
        self.cfg = cfg or TuneConfig()
        self.effective = self.cfg
        self.device = torch.device(device) if device is not None else None
        self.reserve = reserve
        self.max_batch = max_batch
        self.fallbacks: list[str] = []
        self.notes: list[str] = []
        self.skipped: dict[str, str] = {}
        self.warmup_seconds: dict[tuple, float] = {}
        self.warmup_reserved_bytes = 0
        self.fp32_reruns = 0
        self._deferred_flags: list[torch.Tensor] | None = None   # set during forward_deferred: guard flags, no sync

    def record(self, msg: str) -> None:
        self.fallbacks.append(msg)

    # ----------------------------------------------------------------------------------------------------------

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        if batch.dim() != 4 or batch.shape[1] != 3:
            raise ValueError(f"restore expects a [B,3,S,S] batch, got {tuple(batch.shape)}")
        if self.device is not None and batch.device != self.device:
            batch = batch.to(self.device)
        with torch.no_grad():
            limit = self.max_batch or batch.shape[0]
            outs = [self._run_splitting(chunk) for chunk in batch.split(limit)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _run_splitting(self, chunk: torch.Tensor) -> torch.Tensor:
        try:
            return self._run_guarded(chunk)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            n = chunk.shape[0]
            self._after_oom()
            if n == 1:
                raise
            half = (n + 1) // 2
            self.max_batch = half if self.max_batch is None else min(self.max_batch, half)
            self.record(f"out of memory at batch {n}: running batches of at most {self.max_batch} from now on")
            return torch.cat([self._run_splitting(part) for part in chunk.split(self.max_batch)])

    def _after_oom(self) -> None:
        reset = getattr(self.forward, "reset", None)
        if callable(reset):
            reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def forward_deferred(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`self(batch)` without the NaN guard's host sync: returns (out, finite), `finite` a device bool scalar
        (None when no guard applies). A caller that already waits for the batch reads `finite` then and, if it is
        False, calls `recover(batch)`. Lets a pipeline queue the next batch while this one computes."""
        self._deferred_flags = []
        try:
            out = self(batch)
            flags = self._deferred_flags
        finally:
            self._deferred_flags = None
        if not flags:
            return out, None
        return out, flags[0] if len(flags) == 1 else torch.stack(flags).all()

    def recover(self, batch: torch.Tensor) -> torch.Tensor:
        """The fp32 re-run of a batch whose deferred finite check failed (what `self(batch)` does inline)."""
        with torch.no_grad():
            return self._rerun_fp32(batch.to(self.device) if self.device is not None else batch)

    def _run_guarded(self, chunk: torch.Tensor) -> torch.Tensor:
        key = (chunk.shape[0], tuple(chunk.shape[1:]), chunk.dtype)
        first = key not in self.warmup_seconds
        start = time.perf_counter() if first else 0.0
        out = self.forward(chunk)
        if first:
            self._end_warmup(key, start, chunk.device)
        out = out.float()
        if self.reserve is not None:
            if self._deferred_flags is not None:
                self._deferred_flags.append(torch.isfinite(out.sum(dtype=torch.float32)))
            elif not all_finite(out):
                out = self._rerun_fp32(chunk)
        return out

    def _end_warmup(self, key: tuple, start: float, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self.warmup_reserved_bytes = max(self.warmup_reserved_bytes, torch.cuda.memory_reserved(device))
            torch.cuda.empty_cache()  # return what cuDNN's algorithm search left in the cache
        self.warmup_seconds[key] = time.perf_counter() - start

    def _rerun_fp32(self, chunk: torch.Tensor) -> torch.Tensor:
        fp32 = self.reserve.fp32_model(self.model)
        out = fp32(chunk.float())
        self.fp32_reruns += 1
        how = "original fp32 weights" if self.reserve.exact else "up-cast half weights (no fp32 originals kept)"
        ok = "finite" if all_finite(out) else "still non-finite"
        self.record(f"non-finite {self.effective.amp} output for a batch of {chunk.shape[0]}: re-ran it in fp32 "
                    f"({how}): {ok}")
        return out

    def warmup(self, batch_sizes: tuple[int, ...], size: int, dtype: torch.dtype = torch.float32) -> None:
        """Run each batch size once on zeros so compile/capture/cuDNN search happen now, not on the first image."""
        device = self.device or torch.device("cpu")
        for bs in batch_sizes:
            self(torch.zeros(bs, 3, size, size, device=device, dtype=dtype))


# ---------------------------------------------------------------------------------------------------------------


def all_finite(out: torch.Tensor) -> bool:
    """Whether every element is finite, with one reduction kernel and one host sync per batch.

    The fp32 sum is NaN/inf whenever any element is; it can also overflow for finite elements near the fp32 limit
    (> 1e32 for a 512 px batch), which only triggers a harmless fp32 re-run of an output that is garbage anyway.
    `isfinite(out).all().item()` costs two full-size kernels (a bool tensor, then the reduction) before the sync.
    """
    return math.isfinite(out.sum(dtype=torch.float32).item())


def bound_cudnn_workspace(cap_mib: int = CUDNN_WORKSPACE_CAP_MIB) -> None:
    """Cap cuDNN's per-algorithm workspace unless the user chose a cap; cuDNN reads it when it tries algorithms."""
    os.environ.setdefault("CUDNN_CONV_WSCAP_DBG", str(cap_mib))


def build_restorer(model: nn.Module, cfg: TuneConfig | None = None, device: str | torch.device | None = None,
                   buckets: tuple[int, ...] = cuda_graph.BUCKETS, compile_backend: str | Callable = "inductor"
                   ) -> Restorer:
    """Apply cfg's switches to `model` (modified in place: cast, flags) and return the guarded Restorer.

    Args:
        model: a FullGenerator in eval mode (load_model); moved to `device` if it is elsewhere.
        cfg: the switches; None = all off (fp32 eager).
        device: where it runs; default = where the model's parameters are.
        buckets: CUDA-graph batch buckets.
        compile_backend: torch.compile backend; anything but "inductor" is for tests (e.g. "eager" checks the
            whole-graph trace quickly).
    """
    cfg = cfg or TuneConfig()
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model = model.to(device).eval().requires_grad_(False)
    if device.type == "cuda":
        bound_cudnn_workspace()

    restorer = Restorer(forward=model, model=model, cfg=cfg, device=device)
    off: dict[str, object] = {}

    def skip(name: str, reason: str) -> None:
        restorer.skipped[name] = reason
        restorer.record(f"{name} skipped: {reason}")
        off[name] = _OFF[name]

    for name in cfg.enabled():
        reason = SWITCH_MODULES[name].is_supported(device, cfg)
        if reason is not None:
            skip(name, reason)

    def on(name: str) -> bool:
        return getattr(cfg, name) not in (False, None, "off") and name not in restorer.skipped

    forward: Callable[[torch.Tensor], torch.Tensor] = model
    for name in APPLY_ORDER:
        if not on(name):
            continue
        if name == "act_checkpoint":
            reason = act_checkpoint.apply(model, cfg)
            if reason:
                skip(name, reason)
        elif name == "amp" and on("fused"):
            pass  # fuse() builds its half-precision kernels from the fp32 weights; the cast follows it
        elif name == "amp":
            model, restorer.reserve = amp.apply(model, cfg)
            forward = model
        elif name == "fused":
            dtype = amp.AMP_DTYPES[cfg.amp] if on("amp") else None
            try:
                forward = fused.apply(model, cfg, dtype=dtype)
            except Exception as e:
                skip(name, f"gpen_tune.fast.fuse failed ({type(e).__name__}: {str(e)[:200]}); using the unfused model")
                forward = model
            if dtype is not None:  # the generator stays as the NaN fallback's template: shrink it to half too
                model, restorer.reserve = amp.apply(model, cfg)
                if name in restorer.skipped:
                    forward = model
        elif name == "compile":
            forward = torch_compile.apply(forward, cfg, on_fallback=restorer.record, backend=compile_backend)
        elif name == "cuda_graph":
            if on("compile") and cuda_graph.compile_already_graphs(cfg):
                restorer.notes.append(f"cuda_graph: --compile {cfg.compile} already replays CUDA graphs; "
                                      "no second manual capture")
                continue
            forward = cuda_graph.apply(forward, cfg, on_fallback=restorer.record, buckets=buckets)
    restorer.forward = forward
    restorer.model = model
    restorer.effective = replace(cfg, **off)
    return restorer
