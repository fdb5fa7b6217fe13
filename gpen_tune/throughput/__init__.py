"""Throughput: whole folders through a three-stage pipeline with faces batched across images.

    from gpen_tune.throughput import enhance_folder
    summary = enhance_folder("photos/", "restored/", EnhanceSettings(device="cuda"), workers=8)

Imports torch and the face pipeline only when used.
"""

from __future__ import annotations

_LAZY = {
    "enhance_folder": ("gpen_tune.throughput.api", "enhance_folder"),
    "list_inputs": ("gpen_tune.throughput.api", "list_inputs"),
    "run_pipeline": ("gpen_tune.throughput.runner", "run_pipeline"),
    "RunnerConfig": ("gpen_tune.throughput.runner", "RunnerConfig"),
    "RunSummary": ("gpen_tune.throughput.runner", "RunSummary"),
    "ImageResult": ("gpen_tune.throughput.runner", "ImageResult"),
    "Restorer": ("gpen_tune.restore.restorer", "Restorer"),
    "EnhancerStages": ("gpen_tune.throughput.stages", "EnhancerStages"),
    "paste_faces_device": ("gpen_tune.throughput.gpu_paste", "paste_faces_device"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpen_tune.throughput' has no attribute {name!r}")
