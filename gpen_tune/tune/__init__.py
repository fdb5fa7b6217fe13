"""The six optimizations, one module each, composed by `TuneConfig`; `apply.apply_switches` applies them in order.

    from gpen_tune.tune import TuneConfig, presets
    from gpen_tune.restore import build_restorer
    restore = build_restorer(model, presets["balanced"], device="cuda")
    out = restore(batch)          # [B,3,S,S] in [-1,1] -> fp32; restore.fallbacks says what fell back
"""

from gpen_tune.tune.options import PRESETS, STEPS, TuneConfig, choose_preset, resolve_preset

presets = PRESETS

__all__ = ["PRESETS", "STEPS", "TuneConfig", "choose_preset", "presets", "resolve_preset"]
