"""Triton as an optional dependency, imported in one place for the project's kernels.

`triton` and `tl` are None where Triton is not installed (or fails to import) or no kernel can run (no CUDA device,
no interpreter): each kernel module then keeps its PyTorch path. `INTERPRET`: Triton's CPU interpreter is on
(TRITON_INTERPRET=1, set before Triton is imported), which the CPU tests use to run the kernels on CPU tensors.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

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


def hash_compiler_in_background(device: torch.device | str) -> None:
    """Start Triton's one-per-process cache key (a sha256 over its compiler library, ~500 MB: 0.4-1.5 s, paid by
    the first kernel launch otherwise) on a daemon thread, so that it overlaps the model's load: reading and
    hashing release the GIL. Call where the device is known; nothing happens where no kernel runs."""
    if not kernel_runs_on(device) or INTERPRET:
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError:                       # pragma: no cover - another Triton layout: the first launch hashes
        return

    def run() -> None:
        try:
            triton_key()                      # lru_cached: the first launch finds it done
        except Exception:                     # noqa: BLE001 - the first launch computes it again and reports
            pass

    threading.Thread(target=run, name="gpen-triton-key", daemon=True).start()


_COMPILING_AHEAD: ContextVar[bool] = ContextVar("gpen_compiling_ahead", default=False)
COMPILE_THREADS = 8      # Triton's compiler releases the GIL in its heavy passes: threads compile in parallel


def launch(kernel: Any, grid: Any, *args: Any, **meta: Any) -> None:
    """`kernel[grid](*args, **meta)`; inside `compile_ahead()` the kernel is only queued for compiling (its
    outputs are left unwritten)."""
    if _COMPILING_AHEAD.get():
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


@contextlib.contextmanager
def compile_ahead(threads: int = COMPILE_THREADS) -> Iterator[bool]:
    """A dry pass of a model inside this block queues every kernel it would launch for compiling on `threads`
    threads, and the block's end waits for them all: a first call's kernels compile side by side instead of one
    after another (a kernel already in Triton's on-disk cache only loads). Yields False (and changes nothing: the
    caller skips its dry pass) where this Triton has no asynchronous compile or no kernel is compiled (the
    interpreter)."""
    mode = getattr(triton, "AsyncCompileMode", None) if triton is not None else None
    if mode is None or INTERPRET:
        yield False
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="gpen-triton-compile") as pool, mode(pool):
        token = _COMPILING_AHEAD.set(True)
        try:
            yield True
        finally:
            _COMPILING_AHEAD.reset(token)


__all__ = ["IMPLS", "INTERPRET", "compile_ahead", "hash_compiler_in_background", "kernel_runs_on", "launch",
           "resolve_impl", "tl", "triton"]
