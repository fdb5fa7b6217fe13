"""The six optimizations, one module each, composed by `TuneConfig` and applied by `build_restorer`.

    from gpen_tune.tune import TuneConfig, presets, build_restorer
    restore = build_restorer(model, presets["balanced"], device="cuda")
    out = restore(batch)          # [B,3,S,S] in [-1,1] -> fp32; restore.fallbacks says what fell back
"""

from gpen_tune.tune.options import PRESETS, STEPS, TuneConfig, choose_preset, resolve_preset

presets = PRESETS


def __getattr__(name: str):
    """`Restorer` and `build_restorer` import torch: load them on first use so the CLI starts fast."""
    if name in ("Restorer", "build_restorer"):
        from gpen_tune.tune import restorer

        return getattr(restorer, name)
    raise AttributeError(f"module 'gpen_tune.tune' has no attribute {name!r}")


__all__ = ["PRESETS", "STEPS", "Restorer", "TuneConfig", "build_restorer", "choose_preset", "presets",
           "resolve_preset"]
