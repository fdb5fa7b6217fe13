"""One cache directory for every downloaded file: $GPEN_TUNE_HOME, else the user cache dir."""

from __future__ import annotations

import os
from pathlib import Path

from gpen_tune.model.configs import ModelInfo


def cache_dir() -> Path:
    """$GPEN_TUNE_HOME, else $XDG_CACHE_HOME/gpen-tune, else ~/.cache/gpen-tune (created on demand)."""
    env = os.environ.get("GPEN_TUNE_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpen-tune"


def cached_file(filename: str) -> Path:
    """Where a weights file of this name lives in the cache (it may not exist)."""
    return cache_dir() / filename


class WeightsNotFoundError(FileNotFoundError):
    """A registry model whose file is not cached; the message says how to get it."""


def missing_message(info: ModelInfo, problem: str, url: str | None = None) -> str:
    """One line: the file, what went wrong, where to get it and the exact path to put it at."""
    dest = cached_file(info.filename)
    msg = (f"{info.filename} {problem}. Download {url or info.urls[0]} yourself and put it at {dest} "
           f"(or run `gpen-tune weights download {info.name} --file PATH`, or pass --weights PATH)")
    if "modelscope" in info.source_note.lower():
        msg += f"; {info.name} is {info.source_note}"
    return msg
