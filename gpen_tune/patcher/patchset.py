"""Load the patch set in `patches/` (next to the gpen_tune package) under a private module name.

The folder is called `patches/` (readable on its own, see the design card), but a top-level import name that
generic could be shadowed by any other installed package, so it is loaded by path as `gpen_tune_patches`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

MODULE_NAME = "gpen_tune_patches"


def patch_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "patches"


def load() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    init = patch_dir() / "__init__.py"
    if not init.is_file():
        raise ImportError(f"gpen-tune's patch set is missing: expected {init}")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    return module
