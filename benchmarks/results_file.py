"""Where a benchmark's JSON goes: `OUT/YYYYMMDD-HHMMSS_NAME.json`, written to a temporary name and renamed, so
a run cut short leaves no half-written result."""

from __future__ import annotations

import json
import time
from pathlib import Path


def write_result(out: Path, name: str, result: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}_{name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(path)
    return path
