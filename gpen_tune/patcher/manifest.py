"""`.gpen_tune/manifest.json`: which patches are installed and the sha256 of every file they touched.

The manifest lives in the checkout, so it is read as untrusted data: every entry must name a file the patch set
really edits or adds, with 64-hex-digit hashes; anything else (`../victim.txt`, an absolute path, a missing key)
is refused with one line before any file is read or written.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from gpen_tune.patcher.errors import PatchError
from gpen_tune.patcher.paths import checked_rel, read_regular
from gpen_tune.patcher.upstream import UPSTREAM_COMMIT, UPSTREAM_REPO

STATE_DIR = ".gpen_tune"
MANIFEST = f"{STATE_DIR}/manifest.json"
PRISTINE = f"{STATE_DIR}/pristine"
FORMAT = 1
_HEX = frozenset("0123456789abcdef")


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
    def read(cls, root: Path, patches: Collection[str], edited: Collection[str], added: Collection[str]) \
            -> Manifest | None:
        """The manifest of checkout `root` (from `real_root`), None when there is none.

        patches / edited / added: the public patch names and the paths the patch set edits and adds; an entry
        outside them is refused.
        """
        data = read_regular(root, MANIFEST)
        if data is None:
            return None
        where = root / MANIFEST
        try:
            doc = json.loads(data.decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, this gpen-tune reads format {FORMAT}")
            names = doc["patches"]
            if not isinstance(names, list) or not all(isinstance(n, str) and n in patches for n in names):
                raise ValueError(f"patches {names!r} are not all known patch names")
            files = _entries(doc["files"], edited, ("pristine_sha256", "patched_sha256"), where, "files")
            ours = _entries(doc["added"], added, ("patched_sha256",), where, "added")
        except (ValueError, KeyError, TypeError) as exc:
            raise PatchError(f"{where}: unreadable manifest ({_one_line(exc)}); restore the upstream files (e.g. git "
                             f"checkout) and delete {STATE_DIR}/") from None
        return cls(tuple(names), files, ours)


def _entries(raw: object, allowed: Collection[str], keys: tuple[str, ...], where: Path, section: str) \
        -> dict[str, dict[str, str]]:
    if not isinstance(raw, dict):
        raise ValueError(f"'{section}' is not an object")
    out: dict[str, dict[str, str]] = {}
    for rel, info in raw.items():
        checked_rel(rel, str(where))
        if rel not in allowed:
            raise PatchError(f"{where}: lists {rel!r} under '{section}', a file gpen-tune never writes; refused, "
                             f"nothing was changed; restore the upstream files (e.g. git checkout) and delete "
                             f"{STATE_DIR}/")
        if not isinstance(info, dict) or any(not _is_sha256(info.get(k)) for k in keys):
            raise ValueError(f"'{section}' entry {rel!r} lacks {' and '.join(keys)} (64 hex digits each)")
        out[rel] = {k: info[k] for k in keys}
    return out


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
