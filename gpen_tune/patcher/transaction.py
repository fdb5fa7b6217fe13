"""All-or-nothing file replacement: every new file is written to a temp name first, then all are renamed.

If anything fails (writing a temp file, a rename, a deletion), every step already done is undone from backups
and the temp files are removed, so the tree is exactly as before. `step_hook(i, path)` runs before each rename:
tests use it to inject a failure mid-way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from gpen_tune.patcher.errors import PatchError

StepHook = Callable[[int, Path], None]


def _sibling(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.gpen-tune-{tag}-{os.getpid()}")


def commit(writes: dict[Path, bytes | None], step_hook: StepHook | None = None) -> None:
    """writes: path -> new bytes, or None to delete the path. Raises PatchError; on error nothing changed."""
    temps: dict[Path, Path] = {}
    made_dirs: list[Path] = []
    undo: list[Callable[[], None]] = []
    backups: list[Path] = []
    try:
        for path, data in writes.items():
            if data is None:
                continue
            missing = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
            for d in reversed(missing):
                d.mkdir()
                made_dirs.append(d)
            tmp = _sibling(path, "new")
            tmp.write_bytes(data)
            if path.exists():
                shutil.copymode(path, tmp)
            temps[path] = tmp
        for i, path in enumerate(sorted(writes)):
            if step_hook is not None:
                step_hook(i, path)
            backup = _sibling(path, "old")
            if writes[path] is None:
                if path.exists():
                    os.replace(path, backup)
                    backups.append(backup)
                    undo.append(lambda p=path, b=backup: os.replace(b, p))
                continue
            if path.exists():
                shutil.copy2(path, backup)
                backups.append(backup)
                os.replace(temps.pop(path), path)
                undo.append(lambda p=path, b=backup: os.replace(b, p))
            else:
                os.replace(temps.pop(path), path)
                undo.append(lambda p=path: p.unlink())
    except (OSError, PatchError) as exc:
        for step in reversed(undo):
            step()
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        for b in backups:
            b.unlink(missing_ok=True)
        for d in reversed(made_dirs):
            if d.exists() and not any(d.iterdir()):
                d.rmdir()
        raise PatchError(f"{getattr(exc, 'filename', None) or 'writing the patched files'}: {exc}; "
                         f"nothing was changed") from exc
    for b in backups:
        b.unlink(missing_ok=True)
