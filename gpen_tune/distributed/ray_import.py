"""Ray, the optional `[ray]` extra, imported in one place. Light on purpose: the CLI checks for Ray before it
imports torch and the pipeline, so `--ray` without Ray answers at once."""

from __future__ import annotations

import importlib.util
from typing import Any

RAY_MISSING = "--ray needs Ray: pip install 'gpen-tune[ray]'"


class RayMissing(ImportError):
    """Ray is not installed (the message is the one line the CLI prints)."""


def check_ray() -> None:
    """RayMissing unless a `ray` package is installed (found without importing it)."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except ImportError:                  # a finder that refuses the name (or a broken parent package)
        found = False
    if not found:
        raise RayMissing(RAY_MISSING)


def import_ray() -> Any:
    try:
        import ray  # optional: the "ray" extra
        import ray.data  # noqa: F401
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray
