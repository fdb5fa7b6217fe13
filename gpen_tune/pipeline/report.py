"""The run's summary and its JSON report: counts, rates, per-stage timings, what the switches did, per image.

`check_report_path` runs before any work (a report that cannot be written fails the command up front, not after
an hour of restoring); `write_report` writes atomically (temp file in the same folder + rename, nothing left
behind on failure).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpen_tune.pipeline.job import STAGES
from gpen_tune.pipeline.outputs import OutputError


def check_report_path(path: Path) -> None:
    """Fail now (one line) if the report could not be written at the end."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"--report {path} is a folder: name a file, e.g. {path / 'report.json'}")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".part"):
            pass
    except OSError as e:
        raise OutputError(f"--report {path}: cannot write there ({e.strerror or e}): choose another path") from None


def summarize(result: Any, wall: float) -> dict[str, Any]:
    """Counts, rates and per-stage totals of an `EnhanceResult`."""
    jobs = result.jobs
    ok = [j for j in jobs if j.status == "ok"]
    faces = sum(j.face_count for j in ok)
    totals = {s: sum(j.timings.get(s, 0.0) for j in jobs) for s in STAGES}
    return {
        "images": len(jobs),
        "restored": len(ok),
        "no_face": sum(j.status == "no_face" for j in jobs),
        "skipped": sum(j.status == "skipped" for j in jobs),
        "failed": result.failed,
        "not_processed": sum(j.status == "dropped" for j in jobs),
        "passed_over": list(result.passed_over),
        "faces": faces,
        "nonfinite_faces": result.nonfinite_faces,
        "wall_s": round(wall, 3),
        "images_per_s": round(len(jobs) / wall, 3) if wall else None,
        "faces_per_s": round(faces / wall, 3) if wall else None,
        "stages": stage_table(totals, len(jobs), faces),
    }


def stage_table(totals: dict[str, float], images: int, faces: int) -> dict[str, dict[str, float | None]]:
    """Per stage: total seconds (summed over images; stages overlap in the threaded scheduler), ms per image and
    ms per face."""
    return {k: {"total_s": round(v, 4), "ms_per_image": round(1000 * v / images, 2) if images else None,
                "ms_per_face": round(1000 * v / faces, 2) if faces else None} for k, v in totals.items()}


def tune_summary(tune: Any, restorer: Any) -> dict[str, Any] | None:
    """The TuneConfig asked for, what ran, and every restorer fallback (NaN -> fp32, compile -> eager, OOM)."""
    if tune is None:
        return None
    data: dict[str, Any] = {"requested": asdict(tune), "describe": tune.describe()}
    if restorer is not None:
        data.update(effective=asdict(restorer.effective), effective_describe=restorer.effective.describe(),
                    fallbacks=list(restorer.fallbacks), skipped=dict(restorer.skipped), notes=list(restorer.notes),
                    fp32_reruns=restorer.fp32_reruns, batch_limit=restorer.limit,
                    warmup_s={f"bs{k[0]}": round(v, 3) for k, v in restorer.warmup_seconds.items()},
                    generator=generator_summary(restorer.times))
    return data


def generator_summary(times: Any) -> dict[str, Any]:
    """The generator's own time (CUDA events on CUDA) and the span from its first batch to its last: their ratio
    is how busy the run kept it."""
    span = times.span_s()
    return {"busy_s": round(times.generator_s, 4), "span_s": None if span is None else round(span, 4),
            "batches": times.batches, "faces": times.faces,
            "busy_share": round(times.generator_s / span, 3) if span else None}


def write_report(path: Path, data: dict[str, Any]) -> None:
    """JSON through a temp file in the same folder and os.replace; nothing is left behind on failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
