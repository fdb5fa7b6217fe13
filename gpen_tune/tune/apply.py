"""Apply the switches of a TuneConfig to a generator in one fixed order; the composed forward and what ran.

Every switch module has the same two calls: `is_supported(device, cfg)` (None, or why it cannot run here) and
`apply(done: Applied)`, which reads and extends the build so far. `apply_switches` skips the unsupported ones with
their reason, then calls `apply` of each switch that is on, in `options.APPLY_ORDER`: act_checkpoint -> amp -> fused
-> onednn -> compile -> cuda_graph -> lazy_detector -> face_crop (the last two act on the pipeline, which reads them
from the TuneConfig; their `apply` leaves the generator alone). `gpen_tune.restore.build_restorer` wraps the result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from gpen_tune.tune import act_checkpoint, amp, cuda_graph, face_crop, fused, lazy_detector, onednn, torch_compile
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import APPLY_ORDER, TuneConfig

SWITCH_MODULES = {
    "act_checkpoint": act_checkpoint,
    "amp": amp,
    "fused": fused,
    "onednn": onednn,
    "compile": torch_compile,
    "cuda_graph": cuda_graph,
    "lazy_detector": lazy_detector,
    "face_crop": face_crop,
}

__all__ = ["SWITCH_MODULES", "Applied", "apply_switches"]


def apply_switches(model: nn.Module, cfg: TuneConfig, device: torch.device, buckets: tuple[int, ...],
                   compile_backend: str | Callable = "inductor") -> Applied:
    """Apply cfg's switches to `model` (already on `device`; modified in place: cast, flags) in APPLY_ORDER.

    `buckets`: the CUDA-graph batch buckets (the restorer's table); `compile_backend`: anything but "inductor" is
    for tests (e.g. "eager" checks the whole-graph trace quickly). A later fallback (compile -> eager at the first
    call, graph capture failure) is written to `Applied.log` too: it is the list the switches report into.
    """
    done = Applied(forward=model, model=model, cfg=cfg, device=torch.device(device), buckets=buckets,
                   compile_backend=compile_backend)
    for name in cfg.enabled():
        reason = SWITCH_MODULES[name].is_supported(device, cfg)
        if reason is not None:
            done.skip(name, reason)
    for name in APPLY_ORDER:
        if done.on(name):
            SWITCH_MODULES[name].apply(done)
    return done
