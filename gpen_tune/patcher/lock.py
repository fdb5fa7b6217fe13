"""One apply-patches at a time per checkout: an exclusive flock on `.gpen_tune/lock`, taken before planning.

A second apply or revert waits for the first (saying so in one line) and then plans on the tree the first one
left, so two runs with different `--only` end with both patch sets installed. Read-only runs (--status,
--dry-run) take a shared lock when the state folder exists, and take none on an unpatched checkout, which they
must leave exactly as it is. The lock file is created with O_NOFOLLOW inside a real `.gpen_tune/` folder, and is
removed again (with the folder, when empty) once no patch is installed.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.manifest import MANIFEST, STATE_DIR
from gpen_tune.patcher.paths import state_dir
from gpen_tune.patcher.transaction import TXN

LOCK = f"{STATE_DIR}/lock"
POLL_S = 0.1


@contextmanager
def checkout_lock(root: Path, *, exclusive: bool, wait_s: float = 600.0,
                  notify: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the checkout's lock (root from `real_root`). Raises PatchError when it is still busy after `wait_s`."""
    try:
        import fcntl  # optional: fcntl (POSIX only)
    except ImportError:  # Windows: no flock; the plan's own sha256 checks still refuse a changed tree
        yield
        return
    state = state_dir(root, STATE_DIR)
    if not exclusive and not state.exists():
        yield
        return
    fd = _acquire(root, exclusive, wait_s, notify, fcntl)
    try:
        yield
    finally:
        try:
            if exclusive:
                _drop_empty_state(root)
        finally:
            if fd is not None:
                os.close(fd)


def _acquire(root: Path, exclusive: bool, wait_s: float, notify, fcntl) -> int | None:
    """The locked file descriptor; None for a read-only run on a state folder without a lock file (an older
    gpen-tune's), which then reads unlocked."""
    path = root / LOCK
    deadline = time.monotonic() + wait_s
    told = False
    while True:
        fd = _open(root, path, create=exclusive)
        if fd is None:
            return None
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise PatchError(f"{path}: another gpen-tune apply-patches on {root} has held this lock for "
                                     f"{wait_s:.0f} s; let it finish (or end it), then run again") from None
                if not told and notify is not None:
                    notify(f"{root}: waiting for another gpen-tune apply-patches on this checkout to finish")
                    told = True
                time.sleep(POLL_S)
            except OSError:  # a filesystem without flock: carry on, the plan's sha256 checks still apply
                return fd
        if _same_file(fd, path):
            return fd
        os.close(fd)  # the holder removed the lock file as it finished: lock the new one


def _open(root: Path, path: Path, create: bool) -> int | None:
    if create:
        state = root / STATE_DIR
        try:
            os.mkdir(state)
        except FileExistsError:
            state_dir(root, STATE_DIR)  # re-check: it must still be a real folder
        except OSError as exc:
            raise PatchError(f"{state}: cannot create it ({exc.strerror}); is the checkout writable?") from None
    flags = ((os.O_RDWR | os.O_CREAT) if create else os.O_RDONLY) | getattr(os, "O_NOFOLLOW", 0) \
        | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PatchError(f"{path}: cannot open the lock file ({exc.strerror}); it must be a plain file, and the "
                         f"checkout writable") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PatchError(f"{path}: is not a plain file; remove it (gpen-tune keeps its lock there)")
    return fd


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _drop_empty_state(root: Path) -> None:
    """With no patch installed (no manifest, no journal), remove the lock file and the empty state folder."""
    if os.path.lexists(root / MANIFEST) or os.path.lexists(root / TXN):
        return
    state = root / STATE_DIR
    try:
        os.unlink(root / LOCK)
        for d in sorted((p for p in state.rglob("*") if p.is_dir() and not p.is_symlink()),
                        key=lambda p: len(p.parts), reverse=True):
            if not any(d.iterdir()):
                d.rmdir()
        if not any(state.iterdir()):
            state.rmdir()
    except OSError:
        pass  # left for the next run: an empty folder or lock file changes nothing
