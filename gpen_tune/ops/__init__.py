"""Plain-PyTorch ops of the generator (no compiled extensions)."""

from gpen_tune.ops.fir import fused_leaky_relu, make_kernel, upfirdn2d

__all__ = ["fused_leaky_relu", "make_kernel", "upfirdn2d"]
