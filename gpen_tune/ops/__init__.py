"""The pipeline's ops, each fast form beside its PyTorch twin with the same signature: fir.py / fir_triton.py (the
4x4 FIR), modconv_epilogue.py / modconv_epilogue_triton.py (the fused generator's passes); the detector's and the
paste's kernels (area_resize.py, nms.py, warp_crop.py, paste.py: Triton kernel and twin in one file); max_pool.py
(MTCNN's ceil-mode pooling on the CPU as strided maxima, ATen's op its twin). Triton is optional
(triton_support.py): without it the twins run."""

from gpen_tune.ops.fir import fused_leaky_relu, make_kernel, upfirdn2d

__all__ = ["fused_leaky_relu", "make_kernel", "upfirdn2d"]
