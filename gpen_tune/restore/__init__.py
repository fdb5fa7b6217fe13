"""The one restorer: a generator (with the TuneConfig switches applied) behind batching, OOM splitting and the
non-finite guard, uint8 crops in and out.

    from gpen_tune.restore import build_restorer, default_batch_size
    restorer = build_restorer(model, cfg, device="cuda", max_batch=default_batch_size("cuda"))
    restored = restorer.restore_crops(crops)          # [B,S,S,3] uint8 RGB

Imports torch only when used.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Restorer": ("gpen_tune.restore.restorer", "Restorer"),
    "build_restorer": ("gpen_tune.restore.restorer", "build_restorer"),
    "as_restorer": ("gpen_tune.restore.restorer", "as_restorer"),
    "default_batch_size": ("gpen_tune.restore.buckets", "default_batch_size"),
    "PendingBatch": ("gpen_tune.restore.staging", "PendingBatch"),
    "StageTimes": ("gpen_tune.restore.staging", "StageTimes"),
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpen_tune.restore' has no attribute {name!r}")
