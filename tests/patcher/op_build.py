"""Whether this host can JIT-build a checkout's op sources (`face_model/op/*.cpp`), which upstream GPEN's op modules
(and the fixture's, which imitate them) build at import on any Linux host where CUDA is available."""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch


def missing_build_tools() -> str | None:
    """What torch.utils.cpp_extension lacks here to build C++ op sources (None: a compiler and ninja are there)."""
    compiler = os.environ.get("CXX", "c++")
    missing = [name for name, found in ((compiler, shutil.which(compiler)), ("ninja", shutil.which("ninja")))
               if not found]
    return f"no {' and no '.join(missing)} on PATH" if missing else None


def builds_ops_at_import() -> bool:
    """Upstream's condition for building its op sources at import (the fixture copies it)."""
    return platform.system() == "Linux" and torch.cuda.is_available()


def skip_unless_checkout_imports() -> None:
    """Skip (reason stated) where a checkout's import would build its op sources and this host cannot."""
    why = missing_build_tools()
    if builds_ops_at_import() and why:
        pytest.skip(f"CUDA is available, so the checkout builds face_model/op/*.cpp at import, and {why}: "
                    "install a C++ compiler and ninja (or run with GPEN_TUNE_OPS=torch on a patched checkout)")
