"""The generator's ops in plain PyTorch, each Triton kernel beside its PyTorch twin with the same signature:
fir.py / fir_triton.py (the 4x4 FIR), modconv_epilogue.py / modconv_epilogue_triton.py (the fused generator's
passes). Triton is optional (triton_support.py): without it the twins run."""

from gpen_tune.ops.fir import fused_leaky_relu, make_kernel, upfirdn2d

__all__ = ["fused_leaky_relu", "make_kernel", "upfirdn2d"]
