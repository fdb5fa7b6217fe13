"""apply / revert / status of the patch set on an upstream GPEN checkout.

Every result is computed from the pristine files (kept in `.gpen_tune/pristine/` inside the checkout after the
first apply) with the requested patches composed in one fixed order, so applying is deterministic and
idempotent, and a revert restores byte-identical originals. The manifest `.gpen_tune/manifest.json` records
the installed patches and the sha256 of each original and patched file: a file changed since patching is
refused rather than overwritten.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.patchset import load as _load_patchset
from gpen_tune.patcher.recognise import REQUIRED, Recognition, parse, recognise
from gpen_tune.patcher.spec import UPSTREAM_COMMIT, UPSTREAM_REPO, EditContext, Patch
from gpen_tune.patcher.transaction import StepHook, commit

patchset = _load_patchset()

STATE_DIR = ".gpen_tune"
MANIFEST = f"{STATE_DIR}/manifest.json"
PRISTINE = f"{STATE_DIR}/pristine"
FORMAT = 1
MARKER = b"gpen_tune_runtime"


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


@dataclass
class Manifest:
    patches: tuple[str, ...]                       # public patches installed
    files: dict[str, dict[str, str]]               # edited upstream file -> {pristine_sha256, patched_sha256}
    added: dict[str, dict[str, str]]               # our file -> {patched_sha256}

    def to_json(self) -> bytes:
        doc = {"tool": "gpen-tune apply-patches", "format": FORMAT,
               "upstream": f"{UPSTREAM_REPO}@{UPSTREAM_COMMIT}", "patches": list(self.patches),
               "files": self.files, "added": self.added}
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def read(cls, root: Path) -> Manifest | None:
        path = root / MANIFEST
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, this gpen-tune reads format {FORMAT}")
            return cls(tuple(doc["patches"]), dict(doc["files"]), dict(doc["added"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise PatchError(f"{path}: unreadable manifest ({exc}); restore the upstream files (e.g. git checkout) "
                             f"and delete {STATE_DIR}/") from None


@dataclass
class Plan:
    """What an apply or revert would do; `commit()` performs it all-or-nothing."""

    root: Path
    action: str                                    # "apply" | "revert"
    before: tuple[str, ...]
    after: tuple[str, ...]
    writes: dict[str, bytes | None] = field(default_factory=dict)     # rel path -> bytes, None = delete
    shown: tuple[str, ...] = ()                    # paths whose change the diff shows (not .gpen_tune state)
    recognition: Recognition | None = None

    @property
    def noop(self) -> bool:
        return not self.writes

    def diff(self) -> str:
        chunks = []
        for rel in self.shown:
            old_path = self.root / rel
            old = old_path.read_bytes().decode() if old_path.exists() else ""
            new_data = self.writes[rel]
            new = new_data.decode() if new_data is not None else ""
            chunks.append("".join(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"a/{rel}" if old_path.exists() else "/dev/null",
                tofile=f"b/{rel}" if new_data is not None else "/dev/null")))
        return "".join(chunks)

    def commit(self, step_hook: StepHook | None = None) -> None:
        commit({self.root / rel: data for rel, data in self.writes.items()}, step_hook=step_hook)
        if self.action == "revert" and not self.after:
            for d in (self.root / PRISTINE, self.root / STATE_DIR):
                _remove_empty_tree(d)


def _remove_empty_tree(d: Path) -> None:
    if not d.is_dir():
        return
    for sub in sorted(d.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if not any(d.iterdir()):
        d.rmdir()


def _check_unmodified(root: Path, manifest: Manifest) -> None:
    for rel, info in {**manifest.files, **manifest.added}.items():
        path = root / rel
        if not path.exists():
            raise PatchError(f"{path}: deleted after gpen-tune patched it; restore it (or the whole checkout) first")
        if sha256(path.read_bytes()) != info["patched_sha256"]:
            raise PatchError(f"{path}: modified after gpen-tune patched it (sha256 differs from {MANIFEST}); "
                             f"move your changes aside, then copy back {PRISTINE}/{rel} or re-run "
                             f"apply-patches on a fresh checkout")
    for rel, info in manifest.files.items():
        copy = root / PRISTINE / rel
        if not copy.exists() or sha256(copy.read_bytes()) != info["pristine_sha256"]:
            raise PatchError(f"{copy}: pristine copy missing or damaged; cannot revert safely, restore the upstream "
                             f"files with git and delete {STATE_DIR}/")


def _sources(root: Path, manifest: Manifest | None) -> dict[str, bytes]:
    """The pristine bytes of every file the recogniser or an edit reads."""
    paths = set(REQUIRED) | {e.path for p in patchset.ALL for e in p.edits}
    out: dict[str, bytes] = {}
    for rel in sorted(paths):
        if manifest is not None and rel in manifest.files:
            out[rel] = (root / PRISTINE / rel).read_bytes()
        elif (root / rel).is_file():
            data = (root / rel).read_bytes()
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
    if not target:
        edited, added = {}, {}
    else:
        edited, added = render(sources, resolve(target))
    writes: dict[str, bytes | None] = {}
    for rel, data in edited.items():
        if not (root / rel).exists() or (root / rel).read_bytes() != data:
            writes[rel] = data
    for rel in old_files:
        if rel not in edited:
            writes[rel] = sources[rel]                       # no longer edited: back to the pristine bytes
    for rel, data in added.items():
        if not (root / rel).exists() or (root / rel).read_bytes() != data:
            writes[rel] = data
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
    plan.writes = writes
    return plan


def _load(root: Path) -> tuple[Manifest | None, dict[str, bytes], Recognition]:
    root = Path(root)
    if not root.is_dir():
        raise PatchError(f"{root}: not a directory; give the path of your GPEN checkout")
    manifest = Manifest.read(root)
    if manifest is not None:
        _check_unmodified(root, manifest)
    sources = _sources(root, manifest)
    recognition = recognise(root, sources, {rel: sha256(d) for rel, d in sources.items()})
    return manifest, sources, recognition


def plan_apply(root: Path, only: Sequence[str] | None = None) -> Plan:
    """Install `only` (default: all six) on top of what is installed; a no-op plan if they already are."""
    manifest, sources, recognition = _load(Path(root))
    requested = tuple(only) if only else patchset.PUBLIC
    before = manifest.patches if manifest else ()
    target = _public(set(before) | set(requested))
    if manifest is not None and set(requested) <= set(before):
        return Plan(Path(root), "apply", before, before, recognition=recognition)
    return _plan_to(Path(root), manifest, sources, target, "apply", recognition)


def plan_revert(root: Path, only: Sequence[str] | None = None) -> Plan:
    """Remove `only` (default: everything); removing all restores the original bytes and deletes our state."""
    manifest, sources, recognition = _load(Path(root))
    if manifest is None:
        return Plan(Path(root), "revert", (), (), recognition=recognition)
    target = () if not only else _public(set(manifest.patches) - set(only))
    if only and not set(only) & set(manifest.patches):
        return Plan(Path(root), "revert", manifest.patches, manifest.patches, recognition=recognition)
    return _plan_to(Path(root), manifest, sources, target, "revert", recognition)


@dataclass(frozen=True)
class Status:
    root: Path
    installed: tuple[str, ...]
    recognition: Recognition
    files: tuple[str, ...]


def status(root: Path) -> Status:
    manifest, _sources_, recognition = _load(Path(root))
    if manifest is None:
        return Status(Path(root), (), recognition, ())
    return Status(Path(root), manifest.patches, recognition, tuple(sorted({**manifest.files, **manifest.added})))
