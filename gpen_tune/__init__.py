"""gpen-tune: GPEN blind face restoration, fast and with little GPU memory.

The public API is small and imports torch only when used:

    import gpen_tune
    model = gpen_tune.load_model("synthetic", model="GPEN-BFR-512", device="cuda")
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "load_model": ("gpen_tune.load", "load_model"),
    "FullGenerator": ("gpen_tune.model.gpen", "FullGenerator"),
    "GPENConfig": ("gpen_tune.model.configs", "GPENConfig"),
    "MODELS": ("gpen_tune.model.configs", "MODELS"),
    "enhance_image": ("gpen_tune.face.pipeline", "enhance_image"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpen_tune' has no attribute {name!r}")
