"""Apply the switches of a TuneConfig to a generator in one fixed order; the composed forward and what ran.

Order (options.APPLY_ORDER): act_checkpoint -> amp -> fused -> compile -> cuda_graph; lazy_detector and face_crop
act on the pipeline (`lazy_detector.apply`, `face_crop.apply`) and are only checked here. A switch that is not
supported on the device is skipped with its reason. `gpen_tune.restore.build_restorer` wraps the result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from gpen_tune.tune import act_checkpoint, amp, cuda_graph, face_crop, fused, lazy_detector, torch_compile
from gpen_tune.tune.options import APPLY_ORDER, TuneConfig

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


@dataclass
class Applied:
    """The composed forward (graphs over compiled over cast model) and the report of how it was built.

    model: the (cast) FullGenerator, template of the fp32 re-run; reserve: its fp32 weights (amp only);
    effective: cfg with skipped switches off; log: every skip and fallback, in order; notes: how switches composed.
    """

    forward: Callable[[torch.Tensor], torch.Tensor]
    model: nn.Module
    cfg: TuneConfig
    effective: TuneConfig
    reserve: amp.Fp32Reserve | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def apply_switches(model: nn.Module, cfg: TuneConfig, device: torch.device, buckets: tuple[int, ...],
                   compile_backend: str | Callable = "inductor") -> Applied:
    """Apply cfg's switches to `model` (already on `device`; modified in place: cast, flags) in APPLY_ORDER.

    `buckets`: the CUDA-graph batch buckets (the restorer's table); `compile_backend`: anything but "inductor" is
    for tests (e.g. "eager" checks the whole-graph trace quickly). A later fallback (compile -> eager at the first
    call, graph capture failure) is written to `Applied.log` too: it is the list the switches report into.
    """
    done = Applied(forward=model, model=model, cfg=cfg, effective=cfg)
    off: dict[str, object] = {}

    def skip(name: str, reason: str) -> None:
        done.skipped[name] = reason
        done.log.append(f"{name} skipped: {reason}")
        off[name] = _OFF[name]

    for name in cfg.enabled():
        reason = SWITCH_MODULES[name].is_supported(device, cfg)
        if reason is not None:
            skip(name, reason)

    def on(name: str) -> bool:
        return getattr(cfg, name) not in (False, None, "off") and name not in done.skipped

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
            model, done.reserve = amp.apply(model, cfg, amp.keeps_fp32_originals(device, cfg))
            forward = model
        elif name == "fused":
            dtype = amp.AMP_DTYPES[cfg.amp] if on("amp") else None
            try:
                forward = fused.apply(model, cfg, dtype=dtype)
            except Exception as e:
                skip(name, f"the fused generator failed to build ({type(e).__name__}: {str(e)[:200]}); "
                           "using the unfused model")
                forward = model
            if dtype is None and name not in done.skipped:
                # fp32: no re-run to fall back to (a non-finite face keeps its input crop), so the fused module
                # holds the only weights the run needs; the template keeps its structure on the meta device
                model.to("meta")
                done.notes.append("fused fp32: one resident copy of the weights")
            elif dtype is not None:  # the generator stays as the NaN fallback's template: shrink it to half too
                keep = amp.keeps_fp32_originals(device, cfg)
                model, done.reserve = amp.apply(model, cfg, keep)
                if name in done.skipped:
                    forward = model
                elif not keep:
                    # bf16 on the CPU: no fp32 re-run (bf16 cannot overflow), so the fused module holds the only
                    # weights the run needs; the template keeps its structure and dtype on the meta device
                    model.to("meta")
                    done.reserve = None
                    done.notes.append("fused bf16 on the CPU: one resident copy of the weights, no fp32 re-run "
                                      "(a non-finite face keeps its input crop)")
        elif name == "compile":
            forward = torch_compile.apply(forward, cfg, on_fallback=done.log.append, backend=compile_backend)
        elif name == "cuda_graph":
            if on("compile") and cuda_graph.compile_already_graphs(cfg):
                done.notes.append(f"cuda_graph: --compile {cfg.compile} already replays CUDA graphs; "
                                  "no second manual capture")
                continue
            forward = cuda_graph.apply(forward, cfg, on_fallback=done.log.append, buckets=buckets)
    done.forward, done.model = forward, model
    done.effective = replace(cfg, **off)
    return done
