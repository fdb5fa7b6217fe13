"""gpen-tune: GPEN blind face restoration, fast and with little GPU memory.

The public API is small and imports torch only when used:

    import gpen_tune
    restored = gpen_tune.enhance_image("photo.jpg", device="cuda")                     # one image, in memory
    result = gpen_tune.enhance(["albums/"], "restored/", tune=gpen_tune.preset("speed"))  # many, to a folder
    model = gpen_tune.load_model("GPEN-BFR-512", device="cuda")                         # the bare generator
    with gpen_tune.DevicePool(devices=["cuda:0", "cuda:1"]) as pool:                   # every GPU of a host
        gpen_tune.enhance(["albums/"], "restored/", pipeline=pool)
    gpen_tune.ray_enhance(["albums/"], "s3://bucket/restored")                          # a Ray cluster
    gpen_tune.enhance(["albums/"], "out/", tune=gpen_tune.TuneConfig(backend="onnxruntime"))  # ONNX Runtime (CPU)
    gpen_tune.export_onnx("GPEN-BFR-512", "GPEN-BFR-512.pth", "gpen_bfr_512.onnx")        # for ONNX/TensorRT tools
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "load_model": ("gpen_tune.load", "load_model"),
    "FullGenerator": ("gpen_tune.model.gpen", "FullGenerator"),
    "GPENConfig": ("gpen_tune.model.configs", "GPENConfig"),
    "MODELS": ("gpen_tune.model.configs", "MODELS"),
    "enhance": ("gpen_tune.pipeline.api", "enhance"),
    "enhance_image": ("gpen_tune.pipeline.api", "enhance_image"),
    "Pipeline": ("gpen_tune.pipeline.api", "Pipeline"),
    "enhance_video": ("gpen_tune.pipeline.video", "enhance_video"),
    "enhance_frames": ("gpen_tune.pipeline.video", "enhance_frames"),
    "EnhanceSettings": ("gpen_tune.pipeline.settings", "EnhanceSettings"),
    "TuneConfig": ("gpen_tune.tune.options", "TuneConfig"),
    "preset": ("gpen_tune.tune.options", "preset"),
    "InputError": ("gpen_tune.pipeline.api", "InputError"),                 # what enhance raises before any work
    "WeightsNotFoundError": ("gpen_tune.weights.cache", "WeightsNotFoundError"),
    "MissingPart": ("gpen_tune.extras", "MissingPart"),
    "DevicePool": ("gpen_tune.distributed.devices", "DevicePool"),
    "ray_enhance": ("gpen_tune.distributed.ray_data", "ray_enhance"),
    "export_onnx": ("gpen_tune.export.onnx", "export_onnx"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpen_tune' has no attribute {name!r}")
