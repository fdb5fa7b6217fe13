"""The optional parts (extras) and the one line that says how to install a missing one.

Each part is looked up without importing it (`importlib.util.find_spec`), so a command that needs one answers
before it imports torch or does any work: `require("spandrel")` raises `MissingPart` with a line such as
"--bg-upsampler needs spandrel: pip install 'gpen-tune[upscale]'". `gpen-tune doctor` lists every part here.
A new optional backend adds one row to `OPTIONAL_PARTS` and calls `require` where its flag is read.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class OptionalPart:
    module: str          # the import name looked up
    label: str           # how the message names it
    install: str         # the command that installs it
    needed_for: str      # the flag or input that needs it
    heavy: bool = False  # importing it is slow (doctor imports it only with --imports)


ONNX_INSTALL = "pip install 'gpen-tune[onnx]' (or sh scripts/setup.sh --dev)"
ONNX_PARTS = ("onnx", "onnxscript", "onnxruntime")      # the onnx extra: export and --backend onnxruntime

OPTIONAL_PARTS: dict[str, OptionalPart] = {p.module: p for p in (
    OptionalPart("spandrel", "spandrel", "pip install 'gpen-tune[upscale]'", "--bg-upsampler"),
    OptionalPart("ray", "Ray", "pip install 'gpen-tune[ray]'", "--ray", heavy=True),
    OptionalPart("av", "PyAV", "pip install 'av>=18.1,<19' (a gpen-tune dependency: reinstall gpen-tune)",
                 "a video input"),
    OptionalPart("onnxruntime", "ONNX Runtime", ONNX_INSTALL, "--backend onnxruntime"),
    OptionalPart("onnx", "onnx", ONNX_INSTALL, "gpen-tune export"),
    OptionalPart("onnxscript", "onnxscript", ONNX_INSTALL, "gpen-tune export"),
    OptionalPart("tensorrt", "TensorRT", "pip install tensorrt (NVIDIA's wheels; a CUDA GPU)", "a TensorRT engine",
                 heavy=True),
    OptionalPart("fastapi", "the serve extra", "pip install 'gpen-tune[serve]'", "gpen-tune serve"),
)}


class MissingPart(ImportError):
    """An optional part a flag or input needs is not installed; the message is the one line to print."""


def installed(module: str) -> bool:
    """Whether the import name can be found (nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):     # a finder that refuses the name (or a broken parent package)
        return False


def missing_message(module: str) -> str:
    part = OPTIONAL_PARTS[module]
    return f"{part.needed_for} needs {part.label}: {part.install}"


def require(module: str) -> None:
    """MissingPart (one line naming what to install) unless the optional part `module` is installed."""
    if not installed(module):
        raise MissingPart(missing_message(module))


def missing(modules: Sequence[str]) -> list[str]:
    """The import names among `modules` that are not installed (nothing is imported)."""
    return [m for m in modules if not installed(m)]


def import_part(module: str, what: str | None = None) -> ModuleType:
    """The imported optional part, or MissingPart saying what needs it (`what`, default its flag) and how to
    install it: for the parts that are imported where they are used rather than checked up front."""
    try:
        return importlib.import_module(module)
    except ImportError:
        part = OPTIONAL_PARTS[module.split(".")[0]]
        raise MissingPart(f"{what or part.needed_for} needs {part.label}: {part.install}") from None
