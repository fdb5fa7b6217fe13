"""The six optimizations, one module each, composed by `TuneConfig` and applied by `build_restorer`.

    from gpen_tune.tune import TuneConfig, presets, build_restorer
    restore = build_restorer(model, presets["balanced"], device="cuda")
    out = restore(batch)          # [B,3,S,S] in [-1,1] -> fp32; restore.fallbacks says what fell back
"""

from gpen_tune.tune.options import PRESETS, STEPS, TuneConfig, choose_preset, resolve_preset
from gpen_tune.tune.restorer import Restorer, build_restorer

presets = PRESETS

__all__ = ["PRESETS", "STEPS", "Restorer", "TuneConfig", "build_restorer", "choose_preset", "presets",
           "resolve_preset"]
