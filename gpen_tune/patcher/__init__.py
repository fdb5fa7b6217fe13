"""Structural source patches for an upstream GPEN checkout (yangxy/GPEN 2c73670): plan, apply, revert, status."""

from gpen_tune.patcher.engine import (
    Plan,
    Status,
    checkout_session,
    parse_only,
    plan_apply,
    plan_revert,
    resolve,
    status,
)
from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.spec import UPSTREAM_COMMIT, UPSTREAM_REPO
from gpen_tune.patcher.transaction import FileOps

__all__ = ["FileOps", "PatchError", "Plan", "Status", "UPSTREAM_COMMIT", "UPSTREAM_REPO", "checkout_session",
           "parse_only", "plan_apply", "plan_revert", "resolve", "status"]
