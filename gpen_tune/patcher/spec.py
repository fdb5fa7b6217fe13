"""What a patch is: structural edits of upstream files plus files of our own that it adds to the checkout."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import libcst as cst


@dataclass(frozen=True)
class EditContext:
    """Passed to every transform: the file being edited (for messages) and every patch being installed."""

    path: str
    installed: tuple[str, ...]


Transform = Callable[[cst.Module, EditContext], cst.Module]


@dataclass(frozen=True)
class FileEdit:
    path: str                 # relative to the checkout root, '/'-separated
    transform: Transform
    what: str                 # one line for --dry-run/--status: what the edit does


@dataclass(frozen=True)
class AddedFile:
    path: str                 # where it goes in the checkout
    source: Path              # our own file, shipped in patches/
    render: Callable[[str, EditContext], str] | None = None


@dataclass(frozen=True)
class Patch:
    name: str
    summary: str
    switches: tuple[str, ...] = ()
    edits: tuple[FileEdit, ...] = ()
    adds: tuple[AddedFile, ...] = ()
    requires: tuple[str, ...] = ()
    public: bool = True
