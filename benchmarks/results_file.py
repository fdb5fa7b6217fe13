"""Where a benchmark's JSON goes: `OUT/YYYYMMDD-HHMMSS_NAME.json`, written to a temporary name and renamed, so
a run cut short leaves no half-written result."""

from __future__ import annotations

import json
import time
from pathlib import Path


def result_path(out: Path, name: str) -> Path:
    """`OUT/YYYYMMDD-HHMMSS_NAME.json` for now (the folder made if needed)."""
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}_{name}.json"


def write_at(path: Path, result: dict) -> Path:
    """`result` as JSON at `path`, through a temporary name (a benchmark may rewrite it as rounds finish); values
    JSON has no form for (paths, dtypes) are written as their text."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    tmp.rename(path)
    return path


def write_result(out: Path, name: str, result: dict) -> Path:
    return write_at(result_path(out, name), result)
