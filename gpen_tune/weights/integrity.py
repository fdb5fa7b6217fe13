"""Is a weights file the pinned cache file of a model, and do its bytes still have the pinned sha256?

Checked on every load, however the file was named (registry name, its cache path, a symlink or hard link to it):
the file is hashed each time, because a size+mtime shortcut lets an in-place edit through (`os.utime` puts the
mtime back). Hashing costs 0.07 s (GPEN-BFR-256, 76 MB) to 0.2-0.35 s (512/1024/2048, 285 MB) once per run on
a 2-core EPYC, next to 0.2-0.6 s for the whole `load_model` (benchmarks/weights_hash.py). Within one process a
file hashed a moment ago is not hashed again while its device, inode, size, mtime and ctime are unchanged (ctime
cannot be set back from user space), so loading by registry name hashes once, not twice.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpen_tune.model.configs import MODELS, ModelInfo
from gpen_tune.weights import pins
from gpen_tune.weights.cache import cache_dir
from gpen_tune.weights.download import file_sha256


class WeightsMismatchError(ValueError):
    """A weights file whose sha256 differs from the pinned (or requested) one; the message says how to fix it."""


_hashed: dict[tuple[int, int, int, int, int], str] = {}   # stat identity -> sha256, this process only


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def sha256_of(path: Path) -> str:
    """sha256 of the file's bytes (reused within this process while its stat identity is unchanged)."""
    before = os.stat(path)
    known = _hashed.get(_identity(before))
    if known is not None:
        return known
    digest = file_sha256(path)
    if _identity(os.stat(path)) == _identity(before):   # not changed while we read it
        _hashed[_identity(before)] = digest
    return digest


def pinned_entry(path: Path) -> tuple[str, pins.Pin] | None:
    """(cache filename, its pin) when `path` is the same file as a pinned file in the cache, else None."""
    try:
        target = os.stat(path)
    except OSError:
        return None
    for filename, pin in pins.read_pins().items():
        try:
            cached = os.stat(cache_dir() / filename)
        except OSError:
            continue
        if (cached.st_dev, cached.st_ino) == (target.st_dev, target.st_ino):
            return filename, pin
    return None


def check_pinned(path: str | Path) -> None:
    """Raise WeightsMismatchError when `path` is a pinned cache file whose bytes no longer have the pinned sha256."""
    path = Path(path)
    entry = pinned_entry(path)
    if entry is None:
        return
    filename, pin = entry
    got = sha256_of(path)
    if got != pin.sha256:
        info = next((m for m in MODELS.values() if m.filename == filename), None)
        raise WeightsMismatchError(mismatch_message(info, filename, path, pin.sha256, got, requested=False))


def mismatch_message(info: ModelInfo | None, filename: str, where: str | Path, expected: str, got: str, *,
                     requested: bool, saved: bool = True) -> str:
    """One line: the file, both hashes, what was done and how to pin the file if it is the wanted one."""
    kind = "requested" if requested else f"pinned (first verified file, see {pins.pins_path()})"
    name = info.name if info is not None else filename
    fix = (f"if this file is the one you want, pin it with `gpen-tune weights download {name} --sha256 {got}`"
           if not requested else "check the hash you passed with --sha256")
    if not requested and info is not None:
        fix += f", or download it again (`gpen-tune weights download {name} --sha256 {expected}`)"
    state = "refused" if saved else "refused, nothing written to the cache"
    return f"{where}: sha256 {got} differs from the {kind} {expected} for {filename}: {state}; {fix}"
