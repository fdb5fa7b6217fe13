"""Structural source patches for an upstream GPEN checkout (yangxy/GPEN 2c73670): plan, apply, revert, status.

The names load on first use (PEP 562): the engine imports libcst, which the rest of the CLI does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpen_tune.patcher.upstream import UPSTREAM_COMMIT, UPSTREAM_REPO

if TYPE_CHECKING:
    from gpen_tune.patcher.engine import (
        Plan,
        Status,
        locked_checkout,
        parse_only,
        plan_apply,
        plan_revert,
        resolve,
        status,
    )
    from gpen_tune.patcher.errors import PatchError
    from gpen_tune.patcher.transaction import FileOps

_HOMES = {
    "Plan": "engine", "Status": "engine", "locked_checkout": "engine", "parse_only": "engine",
    "plan_apply": "engine", "plan_revert": "engine", "resolve": "engine", "status": "engine",
    "PatchError": "errors", "FileOps": "transaction",
}

__all__ = ["FileOps", "PatchError", "Plan", "Status", "UPSTREAM_COMMIT", "UPSTREAM_REPO", "locked_checkout",
           "parse_only", "plan_apply", "plan_revert", "resolve", "status"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
