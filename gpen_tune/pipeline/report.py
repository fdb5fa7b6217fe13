"""The run's summary and its JSON report: counts, rates, per-stage timings, what the switches did, per input.

`check_report_path` runs before any work (a report that cannot be written, or one that would replace a file
without --overwrite, fails the command up front, not after an hour of restoring); `run_report` builds the JSON
the CLI writes; `write_report` writes it atomically (temp file in the same folder + rename, the user's umask,
nothing left behind on failure).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpen_tune.file_mode import new_file_mode
from gpen_tune.pipeline.job import STAGES
from gpen_tune.pipeline.outputs import OutputError, is_video


def check_report_path(path: Path, existing: str = "refuse") -> bool:
    """Fail now (one line) if the report could not be written at the end, or if it would replace a file that
    `existing` does not let go ("refuse"; "overwrite" and "skip", a resumed batch, replace it). Returns whether
    a file will be replaced (the caller says so)."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"--report {path} is a folder: name a file, e.g. {path / 'report.json'}")
    replaces = path.exists() or path.is_symlink()
    if replaces and existing == "refuse":
        raise OutputError(f"--report {path} already exists: pass --overwrite to replace it or name another file")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{path.name}.", suffix=".part"):
            pass
    except OSError as e:
        raise OutputError(f"--report {path}: cannot write there ({e.strerror or e}): choose another path") from None
    return replaces


def summarize(result: Any, wall: float) -> dict[str, Any]:
    """Counts, rates and per-stage totals of an `EnhanceResult`. Photos count as images, a video's frames as
    frames (a video is one input); faces are those of both."""
    jobs = result.jobs
    videos = [j for j in jobs if j.video is not None or is_video(Path(j.source))]
    photos = [j for j in jobs if j.video is None and not is_video(Path(j.source))]
    ok = [j for j in jobs if j.status == "ok"]
    faces = sum(j.face_count for j in ok)
    frames = sum(int(j.video.get("frames", 0)) for j in videos if j.video is not None)
    totals = {s: sum(j.timings.get(s, 0.0) for j in jobs) for s in STAGES}
    written = [j for j in photos if j.status in ("ok", "no_face")]
    return {
        "images": len(photos),
        "videos": len(videos),
        "frames": frames,
        "restored": sum(j.status == "ok" for j in photos),
        "videos_written": sum(j.status == "ok" for j in videos),
        "no_face": sum(j.status == "no_face" for j in jobs),
        "skipped": sum(j.status == "skipped" for j in jobs),
        "failed": result.failed,
        "not_processed": sum(j.status == "dropped" for j in jobs),
        "passed_over": list(result.passed_over),
        "faces": faces,
        "output_bytes": sum(j.output_bytes() or 0 for j in jobs if j.status in ("ok", "no_face")),
        "nonfinite_faces": result.nonfinite_faces,
        "wall_s": round(wall, 3),
        "images_per_s": _rate(len(written), wall),
        "frames_per_s": _rate(frames, wall),
        "faces_per_s": _rate(faces, wall),
        "stages": stage_table(totals, len(jobs), faces),
    }


def _rate(count: int, wall: float) -> float | None:
    """count / wall; None when nothing was done (an interrupted run that wrote nothing has no rate)."""
    return round(count / wall, 3) if wall and count else None


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


def run_report(result: Any, *, settings: Any, tune: Any, pipeline: Any, detector: str | None,
               wall_s: float) -> dict[str, Any]:
    """The whole run as JSON: version, settings, device, weights, detector, switches, summary, every input.

    `pipeline`: what ran (a Pipeline, a DevicePool, or a stand-in with `device`, `restorer`, `weights_source`);
    `wall_s`: the command's wall time (model loading included)."""
    from gpen_tune import __version__

    summary = summarize(result, wall_s)
    summary["tune"] = tune_summary(tune, getattr(pipeline, "restorer", None))
    if hasattr(pipeline, "device_summary"):                 # several devices: what each one did
        summary["devices"] = pipeline.device_summary()
    if callable(getattr(pipeline, "detector_calls", None)):  # the threaded runs' detector services
        summary["detector_calls"] = pipeline.detector_calls()
    return {"gpen_tune": __version__, "settings": asdict(settings), "device": str(pipeline.device),
            "weights": pipeline.weights_source, "detector": detector, "tune": summary["tune"], "summary": summary,
            "images": [j.report() for j in result.jobs]}


def write_report(path: Path, data: dict[str, Any]) -> None:
    """JSON through a temp file in the same folder and os.replace (mode from the user's umask, as the images);
    nothing is left behind on failure."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
