"""`gpen-tune serve`: face restoration over HTTP, faces of concurrent requests sharing generator calls.

    from gpen_tune.serve import create_app            # the ASGI app (FastAPI), for uvicorn or a user's server
    app = create_app(gpen_tune.EnhanceSettings(weights="GPEN-BFR-512"), spool="/var/spool/gpen")

Modules, one job each: `steps` (the only caller of the pipeline: prepare / restore / finish), `batcher` (one queue
of faces from every request, its generator threads: one on a GPU, one per share of the cores on the CPU),
`service` (uploads and jobs through them), `request_processes` and `request_child` (prepare and finish in other
processes feeding this one's batcher: `--request-processes`), `spool` (the jobs' folder), `limits` (bounds,
header check, auth, the request processes' default and their shared-memory check),
`metrics` (Prometheus), `app` (the routes), `runner` (uvicorn with the CLI's rules), `static/` (the web page).
Needs the `serve` extra: pip install 'gpen-tune[serve]'.
"""

from __future__ import annotations

import importlib

MISSING_EXTRA = "gpen-tune serve needs the serve extra: pip install 'gpen-tune[serve]'"
REQUIRED_MODULES = ("fastapi", "uvicorn", "prometheus_client", "multipart")

_LAZY = {
    "create_app": ("gpen_tune.serve.app", "create_app"),
    "ServeLimits": ("gpen_tune.serve.limits", "ServeLimits"),
}

__all__ = sorted(_LAZY) + ["MISSING_EXTRA", "serve_extra_missing"]


def serve_extra_missing() -> bool:
    """Whether a package of the serve extra cannot be imported (checked without importing torch)."""
    from importlib.util import find_spec

    return any(find_spec(name) is None for name in REQUIRED_MODULES)


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gpen_tune.serve' has no attribute {name!r}")
