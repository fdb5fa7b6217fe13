"""--onednn: the fused generator in its oneDNN form on the CPU (`gpen_tune.model.fused_onednn`), with --fused.

What changes: instead of the fused generator's PyTorch passes between its convolutions, every conv is one oneDNN
call with its bias and leaky ReLU fused in; demodulation and gain stay pending per channel, the style scales the
smaller of a conv's weight and input, the up-conv runs as one ordinary 2x2 phase conv, constant weights are
prepacked in oneDNN's layout. The process also keeps the memory of freed activations (`keep_freed_memory`):
glibc otherwise returns it to the kernel after every call and takes page faults to get it back on the next.
Why it helps: on a 2-core AMX-BF16 Xeon the fused generator spent ~50 % of a batch-1 call in elementwise passes
and ~4 ms a call in page faults (benchmarks/RESULTS.md, "The generator on the CPU").
Tolerance: the fused generator's (same function; bf16 ~51 dB PSNR vs fp32 on GPEN-BFR-256, fp32 max-abs < 1e-5).
Fallback: a build failure -> the fused module's PyTorch passes, recorded in the restorer's fallbacks.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch

from gpen_tune.model.fused_onednn import available
from gpen_tune.tune.applied import Applied
from gpen_tune.tune.options import TuneConfig

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# blocks up to this size come from the heap, not fresh mmaps (the largest GPEN-BFR-512 activation is 32 MiB, bf16)
KEEP_MMAP_THRESHOLD = 32 * 2**20
# free heap memory kept by the process before glibc trims it (one GPEN-BFR-512 call's activations fit)
KEEP_TRIM_THRESHOLD = 512 * 2**20


def is_supported(device: str | torch.device, cfg: TuneConfig) -> str | None:
    if torch.device(device).type != "cpu":
        return "the oneDNN form is the CPU's (GPUs run the fused generator's Triton kernels)"
    if not cfg.fused:
        return "it is a form of the fused generator: add --fused"
    return available()


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds once per process, so freed activations stay mapped and the next call
    reuses them without page faults. False where the C library is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        return False
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD,
                                                                                  KEEP_TRIM_THRESHOLD))


def apply(done: Applied) -> None:
    """The fused switch builds the oneDNN form (`fused.apply` asks `done.on("onednn")`); this keeps freed memory."""
    if done.on("onednn") and keep_freed_memory():
        done.notes.append("onednn: freed activation memory kept by the process (glibc mmap/trim thresholds)")
