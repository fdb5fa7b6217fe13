"""Triton as an optional dependency, imported in one place for the project's kernels.

`triton` and `tl` are None where Triton is not installed (or fails to import) or no kernel can run (no CUDA device,
no interpreter): each kernel module then keeps its PyTorch path. `INTERPRET`: Triton's CPU interpreter is on
(TRITON_INTERPRET=1, set before Triton is imported), which the CPU tests use to run the kernels on CPU tensors.
"""

from __future__ import annotations

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Imported only where a kernel can run (a CUDA device, or the interpreter): on a CPU-only machine the import
# would add ~75 MB to the resident memory of every run for kernels that never launch.
triton = tl = None
if INTERPRET or torch.cuda.is_available():
    try:
        import triton  # optional: triton (GPU kernels; absent on CPU installs)
        import triton.language as tl  # optional: triton
    except Exception:  # pragma: no cover - depends on the install
        triton = tl = None
IMPLS = ("auto", "triton", "torch")


def kernel_runs_on(device: torch.device | str) -> bool:
    """Whether a Triton kernel can run on `device`: CUDA with Triton, or Triton's interpreter for CPU tests."""
    return triton is not None and (torch.device(device).type == "cuda" or INTERPRET)


def resolve_impl(impl: str, device: torch.device | str) -> str:
    """"triton" or "torch" for an op's `impl` argument: "auto" takes the kernel where it runs."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(IMPLS)}, got {impl!r}")
    if impl == "auto":
        return "triton" if kernel_runs_on(device) else "torch"
    if impl == "triton" and not kernel_runs_on(device):
        raise ValueError(f"impl='triton': Triton cannot run on {device}")
    return impl


__all__ = ["IMPLS", "INTERPRET", "kernel_runs_on", "resolve_impl", "tl", "triton"]
