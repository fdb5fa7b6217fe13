"""benchmarks/results holds exactly the JSON files that the docs and the code cite, and every cited file is there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "docs").glob("*.md"))]
JSON_NAME = re.compile(r"[\w.*-]+\.json")
RESULT_NAME = re.compile(r"20\d{6}[-T]\d{4}|^bench-|^face_crop-")   # a dated run, a bench table, the face-crop run
STAMP = re.compile(r"^20\d{6}-\d{4,6}")                             # how code comments and tables name folder runs


def citing_texts() -> str:
    code = sorted((ROOT / "gpen_tune").rglob("*.py"))
    return "\n".join(path.read_text() for path in [*DOCS, *code])


def test_every_json_the_docs_name_exists():
    missing = []
    for doc in DOCS:
        for name in JSON_NAME.findall(doc.read_text()):
            if RESULT_NAME.search(name) and not list(RESULTS.glob(name)):
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert missing == []


def test_every_json_in_results_is_cited():
    """A file is cited by its name, its leading time stamp (a folder run: `20261201-081452`), or a glob that
    matches it."""
    text = citing_texts()
    globs = [g for g in JSON_NAME.findall(text) if "*" in g]
    uncited = [path.name for path in sorted(RESULTS.iterdir())
               if path.name not in text and not (STAMP.match(path.name) and STAMP.match(path.name)[0] in text)
               and not any(path.match(g) for g in globs)]
    assert uncited == []
