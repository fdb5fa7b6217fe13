"""All-or-nothing replacement of files in a checkout, recoverable after any failure, even a crash.

Journal first: before any file of the checkout changes, the old and new bytes of every file and a journal
listing them (with their sha256) are written into `.gpen_tune/txn/`. Then each file is put in place (temp file
next to it + os.replace) or deleted. Deleting the journal is the commit point. If anything fails before that,
every file is rolled back from the journal's copies; if even the rollback fails (a folder turned read-only),
the journal stays, and the next `apply-patches` or `--revert` rolls it back first (`recover`). Nothing is left
behind: no backup next to a file, and the temp files have fixed names the rollback removes.

Every filesystem change goes through a `FileOps` object, so tests can make the N-th change fail.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.paths import checked_rel, inside, kind, read_regular

TXN = ".gpen_tune/txn"
JOURNAL = f"{TXN}/journal.json"
TEMP_SUFFIX = ".gpen-tune-tmp"
FORMAT = 1


class FileOps:
    """The filesystem changes a transaction makes. `before(op, path)` runs first each time: a test overrides it
    to fail at the N-th change (raise OSError), or at every change in one folder (a folder turned read-only)."""

    def before(self, op: str, path: Path) -> None:
        """Called before every change; the default does nothing."""

    def write_new(self, path: Path, data: bytes, mode: int | None) -> None:
        """Create `path` (which must not exist) holding `data`, flushed to disk."""
        self.before("write", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                if mode is not None:
                    os.chmod(f.fileno(), mode)
        except BaseException:
            os.unlink(path)
            raise

    def replace(self, src: Path, dst: Path) -> None:
        self.before("replace", dst)
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        self.before("unlink", path)
        os.unlink(path)

    def mkdir(self, path: Path) -> None:
        self.before("mkdir", path)
        os.mkdir(path)

    def rmdir(self, path: Path) -> None:
        self.before("rmdir", path)
        os.rmdir(path)


@dataclass(frozen=True)
class Entry:
    rel: str                     # the file, relative to the checkout root
    old: str | None              # sha256 before, None = it did not exist
    new: str | None              # sha256 after, None = delete it
    mode: int | None             # permission bits to give the new file (those of the old one)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def commit(root: Path, writes: dict[str, bytes | None], expected: dict[str, str | None],
           ops: FileOps | None = None, remove_dirs: Iterable[str] = ()) -> None:
    """Put `writes` (rel -> new bytes, None = delete) in place, all or nothing. Raises PatchError.

    root: the resolved checkout. expected: rel -> the sha256 each file had when the plan was made (None =
    absent); a file that changed since is refused before anything is written. remove_dirs: folders to remove
    afterwards if they are empty (the state folders a full revert leaves).
    """
    ops = ops or FileOps()
    if read_regular(root, JOURNAL) is not None:
        raise PatchError(interrupted_message(root))
    entries = _entries(root, writes, expected)
    if not entries:
        return
    made = _missing_dirs(root, [e.rel for e in entries])
    _clean_stale_staging(root, ops)
    _stage(root, entries, writes, made, ops)
    try:
        for e in entries:
            _put(root, e, writes[e.rel], ops)
        ops.unlink(root / JOURNAL)                 # the commit point
    except (OSError, PatchError) as exc:
        _undo_or_keep(root, entries, made, ops, exc)
    _clean_staging(root, ops)
    for rel in remove_dirs:
        _rmdir_if_empty(inside(root, rel), ops)


def recover(root: Path, ops: FileOps | None = None) -> bool:
    """Roll back a transaction an earlier run could not finish; True when there was one. Raises PatchError."""
    ops = ops or FileOps()
    raw = read_regular(root, JOURNAL)
    if raw is None:
        _clean_stale_staging(root, ops)
        return False
    entries, made = _read_journal(root, raw)
    try:
        _roll_back(root, entries, made, ops)
        ops.unlink(root / JOURNAL)
    except OSError as exc:
        raise PatchError(f"{root}: cannot finish rolling back the interrupted apply-patches ({_describe(exc)}); "
                         f"fix that, then run it again") from None
    _clean_staging(root, ops)
    _remove_made(root, made, ops)
    return True


def interrupted_message(root: Path) -> str:
    return (f"{root / JOURNAL}: an earlier apply-patches was interrupted; run `gpen-tune apply-patches` or "
            f"`gpen-tune apply-patches --revert` on {root} to roll it back first")


# ---------------------------------------------------------------------------------------------------------------


def _entries(root: Path, writes: dict[str, bytes | None], expected: dict[str, str | None]) -> list[Entry]:
    entries = []
    for rel in sorted(writes):
        data = read_regular(root, checked_rel(rel, "patch plan"))
        now = None if data is None else sha256(data)
        if now != expected.get(rel):
            raise PatchError(f"{root / rel}: changed while apply-patches was planning (another run?); nothing was "
                             f"changed, run it again")
        if now is None and writes[rel] is None:
            continue
        mode = stat.S_IMODE(os.lstat(root / rel).st_mode) if data is not None else None
        entries.append(Entry(rel, now, None if writes[rel] is None else sha256(writes[rel]), mode))
    return entries


def _missing_dirs(root: Path, rels: list[str]) -> list[str]:
    """Parent folders that do not exist yet, outermost first (the journal lists them for the rollback)."""
    missing: list[str] = []
    for rel in rels:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in missing and kind(inside(root, d)) == "missing":
                missing.append(d)
    return missing


def _stage(root: Path, entries: list[Entry], writes: dict[str, bytes | None], made: list[str],
           ops: FileOps) -> None:
    """Write the old and new bytes and then the journal into .gpen_tune/txn; on failure remove what was staged."""
    staged_dirs = [d for d in (".gpen_tune", TXN) if kind(inside(root, d)) == "missing"]
    try:
        for d in staged_dirs:
            ops.mkdir(root / d)
        for i, e in enumerate(entries):
            if e.old is not None:
                ops.write_new(root / TXN / f"{i}.old", read_regular(root, e.rel) or b"", None)
            if e.new is not None:
                ops.write_new(root / TXN / f"{i}.new", writes[e.rel], None)
        doc = {"format": FORMAT, "made_dirs": made,
               "entries": [{"path": e.rel, "old": e.old, "new": e.new, "mode": e.mode} for e in entries]}
        ops.write_new(root / f"{JOURNAL}{TEMP_SUFFIX}", json.dumps(doc, indent=1).encode(), None)
        ops.replace(root / f"{JOURNAL}{TEMP_SUFFIX}", root / JOURNAL)
    except (OSError, PatchError) as exc:
        try:
            _clean_staging(root, ops, strict=True)
            for d in reversed(staged_dirs):
                _rmdir_if_empty(root / d, ops, strict=True)
        except OSError as again:
            raise PatchError(f"{_describe(exc)}; nothing in the checkout was changed, but {again.filename} could not "
                             f"be removed: the next apply-patches removes it") from None
        raise PatchError(f"{_describe(exc)}; nothing was changed") from None


def _put(root: Path, e: Entry, data: bytes | None, ops: FileOps) -> None:
    path = inside(root, e.rel)
    if data is None:
        if kind(path) == "file":
            ops.unlink(path)
        return
    for d in _parents(e.rel):
        if kind(inside(root, d)) == "missing":
            ops.mkdir(root / d)
    tmp = _temp(path)
    if kind(tmp) == "file":
        ops.unlink(tmp)
    ops.write_new(tmp, data, e.mode)
    ops.replace(tmp, path)


def _undo_or_keep(root: Path, entries: list[Entry], made: list[str], ops: FileOps, exc: BaseException) -> None:
    """After a failed step: roll everything back and raise 'nothing was changed', or keep the journal and say so."""
    try:
        _roll_back(root, entries, made, ops)
        ops.unlink(root / JOURNAL)
    except (OSError, PatchError) as again:
        raise PatchError(f"{_describe(exc)}; the files could not all be restored either ({_describe(again)}), so "
                         f"{root / JOURNAL} keeps what is needed: fix that, then run `gpen-tune apply-patches` or "
                         f"`--revert` on {root}, which rolls it back first") from None
    _clean_staging(root, ops)
    _remove_made(root, made, ops)
    raise PatchError(f"{_describe(exc)}; nothing was changed") from None


def _roll_back(root: Path, entries: list[Entry], made: list[str], ops: FileOps) -> None:
    """Return every journal entry to its old bytes (raises OSError, or PatchError for a file changed meanwhile)."""
    for i, e in reversed(list(enumerate(entries))):
        path = inside(root, e.rel)
        tmp = _temp(path)
        if kind(tmp) == "file":
            ops.unlink(tmp)
        data = read_regular(root, e.rel)
        now = None if data is None else sha256(data)
        if now == e.old:
            continue
        if now != e.new:
            raise PatchError(f"{path}: changed by something else during the interrupted apply-patches; restore it "
                             f"by hand (its original is {root / TXN / f'{i}.old'})")
        if e.old is None:
            ops.unlink(path)
            continue
        old = read_regular(root, f"{TXN}/{i}.old")
        if old is None or sha256(old) != e.old:
            raise PatchError(f"{root / TXN / f'{i}.old'}: missing or damaged; restore {path} by hand (git checkout)")
        ops.write_new(tmp, old, e.mode)
        ops.replace(tmp, path)
    for d in reversed(made):
        _rmdir_if_empty(inside(root, d), ops, strict=True)


def _read_journal(root: Path, raw: bytes) -> tuple[list[Entry], list[str]]:
    where = str(root / JOURNAL)
    try:
        doc = json.loads(raw.decode("utf-8"))
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}")
        entries = [Entry(checked_rel(d["path"], where), _sha_or_none(d["old"]), _sha_or_none(d["new"]),
                         _mode_or_none(d["mode"])) for d in doc["entries"]]
        made = [checked_rel(d, where) for d in doc["made_dirs"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PatchError(f"{where}: unreadable journal of an interrupted apply-patches ({exc}); restore the upstream "
                         f"files (git checkout) and delete .gpen_tune/") from None
    return entries, made


def _sha_or_none(v: object) -> str | None:
    if v is None or (isinstance(v, str) and len(v) == 64 and set(v) <= set("0123456789abcdef")):
        return v
    raise ValueError(f"bad sha256 {v!r}")


def _mode_or_none(v: object) -> int | None:
    if v is None or (isinstance(v, int) and 0 <= v <= 0o7777):
        return v
    raise ValueError(f"bad mode {v!r}")


def _clean_staging(root: Path, ops: FileOps, strict: bool = False) -> None:
    """Remove .gpen_tune/txn (each step tried twice; what still fails is removed by the next run)."""
    txn = inside(root, TXN)
    if not _real_dir(txn):
        return
    for name in sorted(p.name for p in txn.iterdir()):
        _try_twice(lambda n=name: ops.unlink(txn / n), strict)
    _rmdir_if_empty(txn, ops, strict)


def _clean_stale_staging(root: Path, ops: FileOps) -> None:
    """Staging files of a transaction that never got its journal (or whose cleanup failed): safe to delete."""
    try:
        _clean_staging(root, ops, strict=True)
    except OSError as exc:
        raise PatchError(f"{root / TXN}: left by an earlier run and cannot be removed ({_describe(exc)}); fix that "
                         f"first, nothing was changed") from None


def _remove_made(root: Path, made: list[str], ops: FileOps) -> None:
    for d in reversed(made):
        _rmdir_if_empty(inside(root, d), ops)


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _rmdir_if_empty(path: Path, ops: FileOps, strict: bool = False) -> None:
    if _real_dir(path) and not any(path.iterdir()):
        _try_twice(lambda: ops.rmdir(path), strict)


def _try_twice(step, strict: bool) -> None:
    try:
        step()
    except OSError:
        try:
            step()
        except OSError:
            if strict:
                raise


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _temp(path: Path) -> Path:
    return path.with_name(f".{path.name}{TEMP_SUFFIX}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, PatchError):
        return str(exc)
    if isinstance(exc, OSError):
        where = exc.filename or "writing the patched files"
        return f"{where}: {exc.strerror or errno.errorcode.get(exc.errno or 0, 'error')}"
    return str(exc)
