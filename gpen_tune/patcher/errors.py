"""The one error the patcher raises: its message names the file and what was expected or what to do."""

from __future__ import annotations


class PatchError(Exception):
    """A checkout, file or manifest that cannot be patched (or reverted) safely; nothing was changed."""
