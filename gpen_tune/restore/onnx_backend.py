"""The onnxruntime restore backend: the generator exported to ONNX and run by ONNX Runtime's CPU provider,
behind the same `Restorer` (batching, OOM split, non-finite guard) as the PyTorch generator.

`build_onnx_restorer` exports the loaded model in memory (PyTorch's exporter, `gpen_tune.export.onnx`), opens an
ONNX Runtime session on it and hands the Restorer an `OnnxRuntimeForward` instead of the torch module. Switches
that change the PyTorch module (fused, compile, CUDA graphs, feature release) do not apply to the exported
graph and are reported as skipped; `--amp fp16` exports an fp16 graph; bf16 has no ONNX Runtime CPU kernels.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from gpen_tune.restore.restorer import Restorer
from gpen_tune.tune.options import TuneConfig

GRAPH_SWITCHES = ("act_checkpoint", "fused", "compile", "cuda_graph")


class OnnxRuntimeForward:
    """[B,3,S,S] float in [-1,1] (CPU tensor) -> [B,3,S,S] fp32 through an ONNX Runtime session.

    An allocation failure inside ONNX Runtime is raised as an "out of memory" RuntimeError, so the Restorer
    splits the batch as it does for PyTorch."""

    def __init__(self, session):
        self.session = session
        self.input_name = session.get_inputs()[0].name

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        feed = {self.input_name: x.detach().to(torch.float32).contiguous().numpy()}
        try:
            y = self.session.run(None, feed)[0]
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own exception types
            text = str(exc)
            if "bad_alloc" in text or "allocate" in text.lower():
                raise RuntimeError(f"out of memory in ONNX Runtime: {text.splitlines()[0][:200]}") from exc
            raise
        return torch.from_numpy(y)


def unsupported_reason(device: torch.device) -> str | None:
    """Why the onnxruntime backend cannot run on `device` here (None: it can)."""
    from gpen_tune.export.extras import INSTALL, missing_packages

    if device.type != "cpu":
        return (f"--backend onnxruntime runs on the CPU (ONNX Runtime's CUDA provider is not part of the onnx "
                f"extra); got --device {device.type}: use --device cpu or --backend torch")
    missing = missing_packages()
    if missing:
        return f"--backend onnxruntime needs {', '.join(missing)}, part of the onnx extra: {INSTALL}"
    return None


def build_onnx_restorer(model: torch.nn.Module, cfg: TuneConfig, *, device: torch.device,
                        max_batch: int | None = None, threads: int | None = None) -> Restorer:
    """A Restorer whose forward is ONNX Runtime running `model` (a fp32 FullGenerator) exported in memory."""
    from gpen_tune.export.extras import OnnxExtraMissing
    from gpen_tune.export.onnx import onnx_graph, ort_session

    reason = unsupported_reason(device)
    if reason:
        raise (ValueError if device.type != "cpu" else OnnxExtraMissing)(reason)
    skipped = {name: "not applicable to the exported ONNX graph (onnxruntime backend)"
               for name in GRAPH_SWITCHES if getattr(cfg, name) not in (False, None)}
    dtype = "fp16" if cfg.amp == "fp16" else "fp32"
    if cfg.amp == "bf16":
        skipped["amp"] = "ONNX Runtime's CPU provider has no bf16 convolutions: the graph runs in fp32"
    t0 = time.perf_counter()
    session = ort_session(onnx_graph(model, dtype).SerializeToString(), threads=threads)
    seconds = time.perf_counter() - t0
    restorer = Restorer(OnnxRuntimeForward(session), device="cpu", dtype=torch.float32, size=model.size,
                        max_batch=max_batch, model=model, cfg=cfg)
    restorer.skipped = skipped
    restorer.effective = replace(cfg, **{name: None if name == "compile" else False for name in GRAPH_SWITCHES},
                                 amp="fp16" if dtype == "fp16" else "off")
    restorer.notes = [f"onnxruntime backend: {dtype} graph exported and loaded in {seconds:.1f} s"]
    restorer.fallbacks = [f"{name} skipped: {why}" for name, why in skipped.items()]
    return restorer
