"""The optional `[onnx]` extra (onnx, onnxruntime), imported in one place: a missing package is one line naming
the extra to install, never an ImportError traceback."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

INSTALL = "pip install 'gpen-tune[onnx]' (or sh scripts/setup.sh --dev)"
PACKAGES = ("onnx", "onnxscript", "onnxruntime")


class OnnxExtraMissing(RuntimeError):
    """onnx or onnxruntime is not installed (the message is the one line the CLI prints)."""


def require(package: str, what: str) -> Any:
    """The imported `package` ("onnx", "onnxruntime", "onnxscript"), or OnnxExtraMissing saying what needs it."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise OnnxExtraMissing(f"{what} needs {package}, part of the onnx extra: {INSTALL}") from None


def missing_packages(names: tuple[str, ...] = PACKAGES) -> list[str]:
    """The packages of the extra that are not installed (found without importing them: the CLI answers at once)."""
    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):      # a finder that refuses the name, or a module without a spec
            found = False
        if not found:
            missing.append(name)
    return missing
