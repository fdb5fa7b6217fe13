"""--compile default|reduce-overhead|max-autotune: torch.compile of the generator, whole graph, no breaks.

What changes: the generator's forward is traced by Dynamo with fullgraph=True (our model is plain PyTorch with no
Python-side effects in forward, unlike upstream whose `platform.system()` call breaks tracing, measured upstream) and
compiled by Inductor: elementwise chains (bias + leaky ReLU + gain, style scaling, demodulation, the FIR padding)
fuse into few kernels. "reduce-overhead" additionally replays the result through CUDA Graphs (then the manual
`--cuda-graph` capture is skipped), "max-autotune" benchmarks GEMM/conv templates (longer warm-up).
Why it helps: GPEN is bound by memory traffic and kernel launches, not FLOPs (upstream, H200: fp32 eager bs1 10.8 ms
-> 8.2 ms compiled, 135 -> 208 faces/s).
Tolerance: max-abs <= 1e-3 vs eager fp32 (fused kernels reorder float sums).
Warm-up: compile happens on the first call per input shape (tens of seconds on a GPU; minutes on a 2-core CPU);
`bench` reports it separately from the averages.
Fallback: any exception at compile or at the first call (other than out-of-memory) prints a warning, is recorded
in the restorer's fallbacks and the eager module is used from then on.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable

import torch

from gpen_tune.tune.applied import Applied
from gpen_tune.tune.oom import is_out_of_memory
from gpen_tune.tune.options import TuneConfig


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    device = torch.device(device)
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if device.type == "cpu":
        if not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++") or shutil.which("cc")):
            return "torch.compile on the CPU needs a C++ compiler (g++/clang++) on PATH"
        return None
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton  # optional: triton probe (private torch path, may be missing)
        except ImportError:  # pragma: no cover - very old torch
            return "torch.compile on CUDA needs Triton"
        if not has_triton():
            return "torch.compile on CUDA needs Triton (pip install triton), which is not importable"
        return None
    return f"torch.compile is not set up for device type {device.type!r} here"


class CompiledForward:
    """Calls the compiled module; on a compile/first-call failure warns once and uses the eager module for good."""

    def __init__(self, module: torch.nn.Module, mode: str, on_fallback: Callable[[str], None] | None = None,
                 fullgraph: bool = True, backend: str | Callable = "inductor"):
        self.eager = module
        self.mode = mode
        self.on_fallback = on_fallback
        self.failed: str | None = None
        self.compiled = None
        try:
            if backend == "inductor":
                self.compiled = torch.compile(module, mode=mode, fullgraph=fullgraph)
            else:  # tests: check the whole-graph trace without Inductor's (slow on CPU) code generation
                self.compiled = torch.compile(module, backend=backend, fullgraph=fullgraph)
        except Exception as e:  # torch.compile itself is lazy; this catches bad options / unsupported Python
            self._give_up(e)

    @property
    def active(self) -> bool:
        """True while the compiled module is in use."""
        return self.compiled is not None and self.failed is None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.active:
            try:
                return self.compiled(x)
            except Exception as e:
                if is_out_of_memory(e):
                    raise
                self._give_up(e)
        return self.eager(x)

    def _give_up(self, exc: BaseException) -> None:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        self.failed = f"compile ({self.mode}) failed, running eager: {type(exc).__name__}: {first}"
        warnings.warn(self.failed, RuntimeWarning, stacklevel=3)
        if self.on_fallback is not None:
            self.on_fallback(self.failed)


def apply(done: Applied) -> None:
    """Wrap the forward so far in a CompiledForward with cfg.compile's mode."""
    done.forward = CompiledForward(done.forward, done.cfg.compile, on_fallback=done.log.append,
                                   backend=done.compile_backend)
