"""The onnxruntime restore backend: the generator exported to ONNX and run by ONNX Runtime's CPU provider,
behind the same `Restorer` (batching, OOM split, non-finite guard) as the PyTorch generator.

`onnx_forward` exports the loaded model (PyTorch's exporter, `gpen_tune.export.onnx`) into the cache
folder, named by a hash of its weights' values, the dtype and the versions (a later run with the same weights
opens the file without exporting: no tens of seconds of tracing, none of the exporter's memory), opens an ONNX
Runtime session on it and hands the Restorer an `OnnxRuntimeForward` instead of the torch module. Switches
that change the PyTorch module (fused, compile, CUDA graphs, feature release) do not apply to the exported
graph and are reported as skipped; `--amp fp16` exports an fp16 graph; bf16 has no ONNX Runtime CPU kernels.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from gpen_tune.extras import MissingPart
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
    from gpen_tune.extras import ONNX_INSTALL, ONNX_PARTS, missing

    if device.type != "cpu":
        return (f"--backend onnxruntime runs on the CPU (ONNX Runtime's CUDA provider is not part of the onnx "
                f"extra); got --device {device.type}: use --device cpu or --backend torch")
    absent = missing(ONNX_PARTS)
    if absent:
        return f"--backend onnxruntime needs {', '.join(absent)}, part of the onnx extra: {ONNX_INSTALL}"
    return None


@dataclass
class OnnxForward:
    """What the Restorer needs from this backend: the forward, and what the switches became."""

    forward: OnnxRuntimeForward
    effective: TuneConfig
    skipped: dict[str, str]
    notes: list[str]


def onnx_forward(model: torch.nn.Module, cfg: TuneConfig, *, device: torch.device,
                 threads: int | None = None) -> OnnxForward:
    """ONNX Runtime running `model` (a fp32 FullGenerator), its graph exported once into the cache."""
    from gpen_tune.export.onnx import onnx_graph, ort_session

    reason = unsupported_reason(device)
    if reason:
        raise (ValueError if device.type != "cpu" else MissingPart)(reason)
    skipped = {name: "not applicable to the exported ONNX graph (onnxruntime backend)"
               for name in GRAPH_SWITCHES if getattr(cfg, name) not in (False, None)}
    dtype = "fp16" if cfg.amp == "fp16" else "fp32"
    if cfg.amp == "bf16":
        skipped["amp"] = "ONNX Runtime's CPU provider has no bf16 convolutions: the graph runs in fp32"
    t0 = time.perf_counter()
    path = cached_graph_path(model, dtype)
    if path.exists():
        how = f"{dtype} graph from the cache ({path})"
        session = ort_session(path, threads=threads)
    else:
        graph = onnx_graph(model, dtype).SerializeToString()
        how = f"{dtype} graph exported"
        try:
            _write_atomically(path, graph)
            how += f" and cached ({path})"
        except OSError as exc:                       # a read-only cache: this run only
            how += f" (not cached: {exc.strerror or exc})"
        session = ort_session(graph, threads=threads)
        del graph
    seconds = time.perf_counter() - t0
    effective = replace(cfg, **{name: None if name == "compile" else False for name in GRAPH_SWITCHES},
                        amp="fp16" if dtype == "fp16" else "off")
    return OnnxForward(OnnxRuntimeForward(session), effective, skipped,
                       [f"onnxruntime backend: {how}, loaded in {seconds:.1f} s"])


def cached_graph_path(model: torch.nn.Module, dtype: str) -> Path:
    """Where the exported graph of these exact weights lives in the cache: named by a sha256 over every tensor's
    values (not the file name: weights changed in memory get their own graph), the config, dtype and versions."""
    from gpen_tune import __version__
    from gpen_tune.export.onnx import OPSET
    from gpen_tune.weights.cache import cache_dir

    digest = hashlib.sha256(f"{model.cfg}|{dtype}|{OPSET}|{torch.__version__}|{__version__}".encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy())
    return cache_dir() / "onnx" / f"gpen-{model.cfg.size}-{dtype}-{digest.hexdigest()[:32]}.onnx"


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
