"""Paths inside a checkout: every path the patcher reads or writes goes through here.

A path read from the checkout (manifest entries, journal entries) is attacker-controlled data: it must be a
relative, normalised, '/'-separated path, and no component between the checkout root and the file may be a
symlink, so nothing outside the checkout is ever read, written or deleted. A file the patcher reads or replaces
must be a regular file (not a symlink, directory, FIFO ...); anything else is refused with one line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from gpen_tune.patcher.errors import PatchError


def checked_rel(rel: object, source: str) -> str:
    """`rel` when it is a plain relative path inside the checkout ('a/b.py'); else PatchError naming `source`."""
    if not isinstance(rel, str) or not rel:
        raise PatchError(f"{source}: path entry {rel!r} is not a relative file path; restore the upstream files "
                         f"(e.g. git checkout) and delete .gpen_tune/")
    parts = rel.split("/")
    if (rel.startswith("/") or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts)
            or PurePosixPath(rel).is_absolute()):
        raise PatchError(f"{source}: path entry {rel!r} points outside the checkout (or is not normalised); "
                         f"refused, nothing was changed; restore the upstream files (e.g. git checkout) and delete "
                         f".gpen_tune/")
    return rel


def real_root(root: Path) -> Path:
    """The checkout directory with symlinks resolved (a symlink to the checkout itself is fine)."""
    if not root.is_dir():
        raise PatchError(f"{root}: not a directory; give the path of your GPEN checkout")
    return root.resolve()


def inside(root: Path, rel: str) -> Path:
    """root/rel after checking that no existing component of rel is a symlink or a non-directory parent.

    `root` must come from `real_root`. The last component may be missing; it is not inspected here (see `kind`).
    """
    path = root
    parts = rel.split("/")
    for i, part in enumerate(parts):
        path = path / part
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return root.joinpath(*parts)
        except OSError as exc:
            raise PatchError(f"{path}: cannot inspect it ({exc.strerror}); fix its permissions first") from None
        if stat.S_ISLNK(st.st_mode):
            raise PatchError(f"{path}: is a symlink; gpen-tune only reads and writes real files inside the "
                             f"checkout, so it refuses it (replace the link by the file or folder itself)")
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise PatchError(f"{path}: is not a directory, but {rel} needs it to be one; move it aside")
    return path


def kind(path: Path) -> str | None:
    """'file', 'missing', or None for a symlink or anything that is not a regular file."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    return "file" if stat.S_ISREG(st.st_mode) else None


def describe(path: Path) -> str:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_regular(root: Path, rel: str) -> bytes | None:
    """Bytes of root/rel, None when it does not exist; PatchError (one line) for anything but a regular file."""
    path = inside(root, rel)
    found = kind(path)
    if found == "missing":
        return None
    if found is None:
        raise PatchError(f"{path}: is {describe(path)} where gpen-tune expects the file {rel}; move it aside "
                         f"(or restore the upstream file), nothing was changed")
    try:
        with open(path, "rb", opener=_no_follow) as f:
            return f.read()
    except OSError as exc:
        raise PatchError(f"{path}: cannot read it ({exc.strerror}); fix its permissions, nothing was changed") \
            from None


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))


def state_dir(root: Path, name: str) -> Path:
    """root/name (the patcher's state folder) when it is missing or a real directory; else PatchError."""
    path = root / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(st.st_mode):
        raise PatchError(f"{path}: is a symlink; gpen-tune keeps its state only in a real folder inside the "
                         f"checkout, so it refuses it (remove the link)")
    if not stat.S_ISDIR(st.st_mode):
        raise PatchError(f"{path}: is not a directory; move it aside (gpen-tune keeps its state there)")
    return path
