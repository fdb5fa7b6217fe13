"""Triton as an optional dependency, imported in one place for the project's kernels.

`triton` and `tl` are None where Triton is not installed (or fails to import): each kernel module then keeps its
PyTorch path. `INTERPRET`: Triton's CPU interpreter is on (TRITON_INTERPRET=1, set before Triton is imported),
which the CPU tests use to run the kernels on CPU tensors.
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover - depends on the install
    triton = None
    tl = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

__all__ = ["INTERPRET", "tl", "triton"]
