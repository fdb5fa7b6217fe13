"""Patch `cuda-graph` for upstream yangxy/GPEN 2c73670: CUDA-graph capture and replay in the FaceGAN wrapper.

FaceGAN runs one face at a time (batch 1), so the generator is launch-bound on a fast GPU. With the switch on,
FaceGAN's runner (via `generator-runner`) keeps one static input buffer and one captured graph per input shape
and dtype: 3 warm-up calls on a side stream, capture, then every call copies the face into the static buffer,
replays and clones the static output. Combines with compile and amp (capture of the compiled/cast model).
Not on CPU (a one-line notice, then eager), and a failed capture falls back to eager with a notice.
Switch: GPEN_TUNE_CUDA_GRAPH=1 or demo.py --cuda_graph. Off: `self.model(img_t)` as upstream.
"""

from __future__ import annotations

from gpen_tune.patcher.spec import Patch

PATCH = Patch(
    name="cuda-graph",
    summary="static-buffer CUDA-graph capture/replay of the generator in FaceGAN (per input size)",
    switches=("GPEN_TUNE_CUDA_GRAPH",),
    requires=("runtime", "generator-runner"),
)
