"""`doctor`: what this machine offers gpen-tune, gathered quickly and without failing on missing optional parts.

`diagnose()` returns a JSON-ready dict with these keys (documented here because `doctor --json` is an interface):

    python        {"version", "executable", "platform"}
    gpen_tune     {"version"}
    torch         {"version", "torchvision", "cuda", "cudnn", "debug"}
    cuda          {"available", "device_count", "bf16", "error"}
    gpus          [{"index", "name", "capability", "free_bytes", "total_bytes", "bf16"}]
    mps           {"available"}
    compile       {"inductor", "cxx", "triton", "cpu", "cuda", "note"}
    optional      {name: {"installed", "version", "importable", "error", "purpose"}}
    not_used      {name: reason} - parts deliberately left out (basicsr)
    cache         {"dir", "env", "exists", "files": [{"name", "bytes", "pinned_sha256"}], "pins", "partial"}
    warnings      [str] - e.g. the loud "no GPU" line

Nothing here compiles, downloads or allocates GPU memory beyond what `torch.cuda.mem_get_info` needs.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import importlib.util
import os
import platform
import shutil
import sys

import gpen_tune
from gpen_tune.extras import OPTIONAL_PARTS

NO_GPU_WARNING = "no CUDA GPU found: gpen-tune runs on CPU, which takes seconds per face"

# import name -> (distribution name, why gpen-tune wants it, heavy: importing it pulls in torchvision, ~3 s)
OPTIONAL = {
    "facexlib": ("facexlib", "RetinaFace detector and face parsing", True),
    "facenet_pytorch": ("facenet-pytorch", "offline MTCNN 5-point face detector (weights ship in the wheel)", True),
    "cv2": ("opencv-python", "image I/O, warps, paste-back", False),
    "matplotlib": ("matplotlib", "benchmark plots, sample photo", False),
    "libcst": ("libcst", "patching an upstream GPEN checkout", False),
    # the optional extras: what needs each, and the line that installs it
    **{p.module: (p.module, f"{p.needed_for}; {p.install}", p.heavy) for p in OPTIONAL_PARTS.values()},
}
NOT_USED = {
    "basicsr": "deliberately not used: it no longer imports with current torchvision (functional_tensor removed) "
               "and drags in training-only packages",
}
KEYS = ("python", "gpen_tune", "torch", "cuda", "gpus", "mps", "compile", "optional", "not_used", "cache",
        "shared_memory", "cuda_mps", "warnings")


def diagnose(check_imports: bool = False) -> dict:
    """Collect the report.

    Light optional parts are always imported to prove they work; the heavy ones (facexlib, facenet_pytorch: they
    import torchvision, which imports torch._dynamo, ~3 s) only with `check_imports=True`, else their
    "importable" is None (= not checked), so the default report stays quick.
    """
    report: dict = {
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "platform": platform.platform()},
        "gpen_tune": {"version": gpen_tune.__version__},
    }
    warnings: list[str] = []
    report.update(_torch_section(warnings))
    report["optional"] = {name: _optional_part(name, dist, purpose, check_imports or not heavy)
                          for name, (dist, purpose, heavy) in OPTIONAL.items()}
    report["not_used"] = {name: {"installed": _dist_version(name) is not None, "reason": reason}
                          for name, reason in NOT_USED.items()}
    report["cache"] = _cache_section(warnings)
    report["shared_memory"] = _shared_memory_section(warnings, bool(report["gpus"]))
    report["cuda_mps"] = _cuda_mps_section()
    if not report["gpus"]:
        warnings.insert(0, NO_GPU_WARNING)
    report["warnings"] = warnings
    return report


# ---------------------------------------------------------------------------------------------------------------


def _torch_section(warnings: list[str]) -> dict:
    try:
        import torch  # heavy: torch, inside the guard that reports it missing
    except Exception as e:  # a broken torch install must still give a report
        warnings.append(f"torch does not import: {e}")
        return {"torch": {"version": None}, "cuda": {"available": False, "device_count": 0, "bf16": False,
                                                     "error": str(e)},
                "gpus": [], "mps": {"available": False}, "compile": _compile_section(None, False)}

    cudnn = None
    try:
        cudnn = torch.backends.cudnn.version()
    except Exception:
        pass
    tinfo = {"version": torch.__version__, "torchvision": _dist_version("torchvision"),
             "cuda": torch.version.cuda, "cudnn": cudnn, "debug": bool(torch.version.debug)}

    gpus, error, available = [], None, False
    try:
        available = torch.cuda.is_available()
        for i in range(torch.cuda.device_count() if available else 0):
            props = torch.cuda.get_device_properties(i)
            try:
                free, total = torch.cuda.mem_get_info(i)
            except Exception as e:  # e.g. a GPU in exclusive mode held by another process
                free, total = None, props.total_memory
                error = f"mem_get_info({i}): {e}"
            gpus.append({"index": i, "name": props.name, "capability": f"{props.major}.{props.minor}",
                         "free_bytes": free, "total_bytes": total, "bf16": props.major >= 8})
    except Exception as e:
        error = str(e)
        warnings.append(f"CUDA is installed but not usable: {e}")
    bf16 = False
    if gpus:
        try:
            bf16 = bool(torch.cuda.is_bf16_supported())
        except Exception:
            bf16 = all(g["bf16"] for g in gpus)
    mps = False
    try:
        mps = bool(torch.backends.mps.is_available())
    except Exception:
        pass
    return {"torch": tinfo,
            "cuda": {"available": available, "device_count": len(gpus), "bf16": bf16, "error": error},
            "gpus": gpus, "mps": {"available": mps}, "compile": _compile_section(torch, bool(gpus))}


def _compile_section(torch, has_gpu: bool) -> dict:
    """Can torch.compile work here? Inductor needs a C++ compiler on CPU and Triton on CUDA. Nothing is built."""
    inductor = torch is not None and importlib.util.find_spec("torch._inductor") is not None
    cxx = None
    for cand in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand and (found := shutil.which(cand)):
            cxx = found
            break
    triton = _dist_version("triton") or _dist_version("pytorch-triton")
    cpu_ok = bool(inductor and cxx)
    cuda_ok = bool(inductor and triton and has_gpu)
    if not inductor:
        note = "torch.compile unavailable (no inductor)"
    elif has_gpu:
        note = "inductor + triton: GPU compile possible" if cuda_ok else "no triton: compile falls back to eager on GPU"
    else:
        note = "inductor + C++ compiler: CPU compile possible" if cpu_ok else "no C++ compiler: compile unavailable"
    return {"inductor": inductor, "cxx": cxx, "triton": triton, "cpu": cpu_ok, "cuda": cuda_ok, "note": note}


def _optional_part(module: str, dist: str, purpose: str, check_imports: bool) -> dict:
    version = _dist_version(dist)
    installed = version is not None or importlib.util.find_spec(module) is not None
    entry = {"installed": installed, "version": version, "importable": None, "error": None, "purpose": purpose}
    if installed and check_imports:
        try:
            mod = importlib.import_module(module)
            entry["importable"] = True
            entry["version"] = version or getattr(mod, "__version__", None)
        except Exception as e:  # an optional part that breaks on import is reported, not fatal
            entry["importable"] = False
            entry["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    elif not installed:
        entry["importable"] = False
    return entry


def _dist_version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cache_section(warnings: list[str]) -> dict:
    from gpen_tune.weights.cache import cache_dir  # heavy: torch (doctor imports light)

    root = cache_dir()
    section: dict = {"dir": str(root), "env": os.environ.get("GPEN_TUNE_HOME"), "exists": root.is_dir(),
                     "files": [], "pins": {}, "partial": []}
    if not root.is_dir():
        return section
    try:
        from gpen_tune.weights.pins import PINS_FILE, read_pins  # heavy: torch (doctor imports light)

        pinned = {k: v.sha256 for k, v in read_pins().items()}
    except Exception as e:
        pinned, PINS_FILE = {}, "sha256-pins.json"
        warnings.append(str(e))
    section["pins"] = pinned
    for p in sorted(root.iterdir()):
        if not p.is_file() or p.name == PINS_FILE or p.name.startswith("."):
            continue
        if p.name.endswith(".part"):
            section["partial"].append({"name": p.name, "bytes": p.stat().st_size})
            continue
        section["files"].append({"name": p.name, "bytes": p.stat().st_size, "pinned_sha256": pinned.get(p.name)})
    return section


def _shared_memory_section(warnings: list[str], has_gpu: bool) -> dict:
    """/dev/shm's free bytes against what `gpen-tune serve`'s request processes need for GPEN-BFR-512 at the default
    queue (they pass faces through it; a container gets 64 MiB unless given more)."""
    from gpen_tune.serve.limits import (  # doctor imports light
        SHARED_MEMORY_DIR,
        ServeLimits,
        request_shared_memory_bytes,
        shared_memory_free,
        shared_memory_shortfall,
    )

    free = shared_memory_free()
    queue = ServeLimits().max_queue_faces
    short = None if free is None else shared_memory_shortfall(512, queue, free)
    if short is not None and has_gpu:
        warnings.append(f"{short}: gpen-tune serve runs without request processes here (a container: --shm-size 2g)")
    return {"dir": SHARED_MEMORY_DIR, "free_bytes": free, "serve_needs_bytes": request_shared_memory_bytes(512, queue),
            "enough_for_serve": short is None}


def _cuda_mps_section() -> dict:
    """NVIDIA MPS for `gpen-tune serve --mps`: its control program, and a daemon this process would already use."""
    from gpen_tune.serve.mps import control_program, running_daemon  # doctor imports light

    daemon = running_daemon()
    return {"control": control_program(), "daemon": None if daemon is None else str(daemon)}
