"""Patch `compile` for upstream yangxy/GPEN 2c73670: torch.compile of the generator inside FaceGAN.

On upstream as shipped torch.compile fails: `platform.system()` is called inside forward (upstream, measured). This
patch pulls in `native-ops` (op path decided once at import; pure-PyTorch ops and no CUDA build while
compiling) and `generator-runner` (FaceGAN.load_model wraps `self.model` once: `torch.compile(model, mode)`).
ModulatedConv2d switches to the batch-friendly formulation under it (no grouped conv).
Switch: GPEN_TUNE_COMPILE=1|default|reduce-overhead|max-autotune, or demo.py --compile [MODE].
Off: no compile, upstream's op choice and ModulatedConv2d.
"""

from __future__ import annotations

from gpen_tune.patcher.spec import Patch

PATCH = Patch(
    name="compile",
    summary="torch.compile of the generator in FaceGAN (pure-PyTorch ops, no platform call in forward)",
    switches=("GPEN_TUNE_COMPILE",),
    requires=("runtime", "native-ops", "generator-runner"),
)
