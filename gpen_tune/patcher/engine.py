"""apply / revert / status of the patch set on an upstream GPEN checkout.

Every result is computed from the pristine files (kept in `.gpen_tune/pristine/` inside the checkout after the
first apply) with the requested patches composed in one fixed order, so applying is deterministic and
idempotent, and a revert restores byte-identical originals. The manifest `.gpen_tune/manifest.json` records
the installed patches and the sha256 of each original and patched file: a file changed since patching is
refused rather than overwritten. Every path comes from the patch set and is checked (`paths`) before it is read
or written; `locked_checkout` holds the checkout's lock and rolls back an interrupted earlier run.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.lock import checkout_lock
from gpen_tune.patcher.manifest import MANIFEST, PRISTINE, STATE_DIR, Manifest
from gpen_tune.patcher.patchset import load as _load_patchset
from gpen_tune.patcher.paths import read_regular, real_root, state_dir
from gpen_tune.patcher.recognise import REQUIRED, Recognition, parse, recognise
from gpen_tune.patcher.spec import EditContext, Patch
from gpen_tune.patcher.transaction import JOURNAL, FileOps, commit, interrupted_message, recover

patchset = _load_patchset()

MARKER = b"gpen_tune_runtime"
EDITED = frozenset(e.path for p in patchset.ALL for e in p.edits)     # upstream files the patch set edits
ADDED = frozenset(a.path for p in patchset.ALL for a in p.adds)       # files of ours it adds


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def resolve(names: Iterable[str]) -> tuple[str, ...]:
    """Requested public names plus everything they require, in the canonical order."""
    wanted: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in patchset.BY_NAME:
            raise PatchError(f"unknown patch {name!r}; choose from {', '.join(patchset.PUBLIC)}")
        if name not in wanted:
            wanted.add(name)
            stack.extend(patchset.BY_NAME[name].requires)
    return tuple(p.name for p in patchset.ALL if p.name in wanted)


def parse_only(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in patchset.PUBLIC]
    if bad or not names:
        raise PatchError(f"--only {text!r}: unknown patch {', '.join(bad) or '(none given)'}; choose from "
                         f"{','.join(patchset.PUBLIC)}")
    return names


@contextmanager
def locked_checkout(root: Path, *, write: bool, notify: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold the checkout's lock for one command (exclusive when `write`); plan and commit inside it.

    For a writing command an earlier run's interrupted transaction is rolled back first; yields whether it was.
    """
    real = real_root(Path(root))
    with checkout_lock(real, exclusive=write, notify=notify):
        yield recover(real) if write else False


@dataclass
class Plan:
    """What an apply or revert would do; `commit()` performs it all-or-nothing."""

    root: Path                                     # the checkout, symlinks resolved
    action: str                                    # "apply" | "revert"
    before: tuple[str, ...]
    after: tuple[str, ...]
    writes: dict[str, bytes | None] = field(default_factory=dict)     # rel path -> bytes, None = delete
    shown: tuple[str, ...] = ()                    # paths whose change the diff shows (not .gpen_tune state)
    recognition: Recognition | None = None
    expected: dict[str, str | None] = field(default_factory=dict)     # rel path -> sha256 when planned (None: absent)
    remove_dirs: tuple[str, ...] = ()              # state folders to remove once empty (a full revert)

    @property
    def noop(self) -> bool:
        return not self.writes

    def diff(self) -> str:
        chunks = []
        for rel in self.shown:
            old_data = read_regular(self.root, rel)
            new_data = self.writes[rel]
            old = old_data.decode("utf-8", errors="replace") if old_data is not None else ""
            new = new_data.decode("utf-8", errors="replace") if new_data is not None else ""
            chunks.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"a/{rel}" if old_data is not None else "/dev/null",
                tofile=f"b/{rel}" if new_data is not None else "/dev/null")))
        return "".join(chunks)

    def commit(self, ops: FileOps | None = None) -> None:
        """All or nothing (see `gpen_tune.patcher.transaction`); `ops` is where tests inject failures."""
        commit(self.root, self.writes, self.expected, ops=ops, remove_dirs=self.remove_dirs)


def _check_unmodified(root: Path, manifest: Manifest) -> None:
    for rel, info in {**manifest.files, **manifest.added}.items():
        path = root / rel
        data = read_regular(root, rel)
        if data is None:
            raise PatchError(f"{path}: deleted after gpen-tune patched it; restore it (or the whole checkout) first")
        if sha256(data) != info["patched_sha256"]:
            raise PatchError(f"{path}: modified after gpen-tune patched it (sha256 differs from {MANIFEST}); "
                             f"move your changes aside, then copy back {PRISTINE}/{rel} or re-run "
                             f"apply-patches on a fresh checkout")
    for rel, info in manifest.files.items():
        copy = read_regular(root, f"{PRISTINE}/{rel}")
        if copy is None or sha256(copy) != info["pristine_sha256"]:
            raise PatchError(f"{root / PRISTINE / rel}: pristine copy missing or damaged; cannot revert safely, "
                             f"restore the upstream files with git and delete {STATE_DIR}/")


def _sources(root: Path, manifest: Manifest | None) -> dict[str, bytes]:
    """The pristine bytes of every file the recogniser or an edit reads."""
    out: dict[str, bytes] = {}
    for rel in sorted(set(REQUIRED) | EDITED):
        if manifest is not None and rel in manifest.files:
            data = read_regular(root, f"{PRISTINE}/{rel}")
            if data is None:
                raise PatchError(f"{root / PRISTINE / rel}: pristine copy missing; restore the upstream files "
                                 f"with git and delete {STATE_DIR}/")
            out[rel] = data
            continue
        data = read_regular(root, rel)
        if data is None:
            continue
        if MARKER in data:
            raise PatchError(f"{root / rel}: already mentions gpen_tune_runtime but {MANIFEST} does not list it "
                             f"(patched by hand or by another tool?); restore the upstream file first")
        out[rel] = data
    return out


def render(sources: dict[str, bytes], installed: Sequence[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(edited upstream files, added files of ours) for the installed patches, from the pristine sources."""
    chosen: list[Patch] = [patchset.BY_NAME[n] for n in installed]
    edited: dict[str, bytes] = {}
    modules = {}
    for patch in chosen:
        for edit in patch.edits:
            if edit.path not in sources:
                raise PatchError(f"{edit.path}: missing; patch {patch.name} edits it")
            module = modules.get(edit.path) or parse(edit.path, sources[edit.path])
            modules[edit.path] = edit.transform(module, EditContext(edit.path, tuple(installed)))
    for rel, module in modules.items():
        edited[rel] = module.code.encode(module.encoding)
    added: dict[str, bytes] = {}
    for patch in chosen:
        for add in patch.adds:
            text = add.source.read_text()
            if add.render is not None:
                text = add.render(text, EditContext(add.path, tuple(installed)))
            added[add.path] = text.encode()
    return edited, added


def _public(names: Iterable[str]) -> tuple[str, ...]:
    names = set(names)
    return tuple(n for n in patchset.PUBLIC if n in names)


def _plan_to(root: Path, manifest: Manifest | None, sources: dict[str, bytes], target: tuple[str, ...],
             action: str, recognition: Recognition) -> Plan:
    before = manifest.patches if manifest else ()
    plan = Plan(root, action, before, target, recognition=recognition)
    old_files = manifest.files if manifest else {}
    old_added = manifest.added if manifest else {}
    edited, added = render(sources, resolve(target)) if target else ({}, {})
    current: dict[str, bytes | None] = {}

    def now(rel: str) -> bytes | None:          # what the checkout holds there (a symlink or folder is refused)
        if rel not in current:
            current[rel] = read_regular(root, rel)
        return current[rel]

    writes: dict[str, bytes | None] = {}
    for rel, data in {**edited, **added}.items():
        if now(rel) != data:
            writes[rel] = data
    for rel in old_files:
        if rel not in edited:
            writes[rel] = sources[rel]                       # no longer edited: back to the pristine bytes
    for rel in old_added:
        if rel not in added:
            writes[rel] = None
    plan.shown = tuple(sorted(writes))
    if not writes and tuple(before) == target:
        return plan
    if target:
        for rel in edited:
            if rel not in old_files:
                writes[f"{PRISTINE}/{rel}"] = sources[rel]
        for rel in old_files:
            if rel not in edited:
                writes[f"{PRISTINE}/{rel}"] = None
        files = {rel: {"pristine_sha256": sha256(sources[rel]), "patched_sha256": sha256(data)}
                 for rel, data in edited.items()}
        manifest_new = Manifest(target, files, {rel: {"patched_sha256": sha256(d)} for rel, d in added.items()})
        writes[MANIFEST] = manifest_new.to_json()
    else:
        for rel in old_files:
            writes[f"{PRISTINE}/{rel}"] = None
        writes[MANIFEST] = None
    dropped = [rel for rel in old_files if rel not in edited]     # their pristine copies go: so do empty folders
    plan.remove_dirs = (*_pristine_dirs(dropped), *(() if target else (PRISTINE, STATE_DIR)))
    plan.writes = writes
    plan.expected = {rel: None if (data := now(rel)) is None else sha256(data) for rel in writes}
    return plan


def _pristine_dirs(files: Iterable[str]) -> list[str]:
    """Folders under .gpen_tune/pristine that hold the pristine copies, deepest first."""
    dirs = {f"{PRISTINE}/" + "/".join(rel.split("/")[:i]) for rel in files for i in range(1, rel.count("/") + 1)}
    return sorted(dirs, key=lambda d: d.count("/"), reverse=True)


def _load(root: Path) -> tuple[Path, Manifest | None, dict[str, bytes], Recognition]:
    real = real_root(Path(root))
    state_dir(real, STATE_DIR)
    if read_regular(real, JOURNAL) is not None:
        raise PatchError(interrupted_message(real))
    manifest = Manifest.read(real, patchset.PUBLIC, EDITED, ADDED)
    if manifest is not None:
        _check_unmodified(real, manifest)
    sources = _sources(real, manifest)
    recognition = recognise(real, sources, {rel: sha256(d) for rel, d in sources.items()})
    return real, manifest, sources, recognition


def plan_apply(root: Path, only: Sequence[str] | None = None) -> Plan:
    """Install `only` (default: all six) on top of what is installed; a no-op plan if they already are."""
    real, manifest, sources, recognition = _load(root)
    requested = tuple(only) if only else patchset.PUBLIC
    before = manifest.patches if manifest else ()
    target = _public(set(before) | set(requested))
    if manifest is not None and set(requested) <= set(before):
        return Plan(real, "apply", before, before, recognition=recognition)
    return _plan_to(real, manifest, sources, target, "apply", recognition)


def plan_revert(root: Path, only: Sequence[str] | None = None) -> Plan:
    """Remove `only` (default: everything); removing all restores the original bytes and deletes our state."""
    real, manifest, sources, recognition = _load(root)
    if manifest is None:
        return Plan(real, "revert", (), (), recognition=recognition)
    target = () if not only else _public(set(manifest.patches) - set(only))
    if only and not set(only) & set(manifest.patches):
        return Plan(real, "revert", manifest.patches, manifest.patches, recognition=recognition)
    return _plan_to(real, manifest, sources, target, "revert", recognition)


@dataclass(frozen=True)
class Status:
    root: Path
    installed: tuple[str, ...]
    recognition: Recognition
    files: tuple[str, ...]


def status(root: Path) -> Status:
    real, manifest, _sources_, recognition = _load(root)
    if manifest is None:
        return Status(real, (), recognition, ())
    return Status(real, manifest.patches, recognition, tuple(sorted({**manifest.files, **manifest.added})))
