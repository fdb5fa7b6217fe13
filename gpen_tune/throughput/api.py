"""`enhance_folder`: restore many photos with the pipelined runner (or the serial driver, for comparison)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpen_tune.throughput.runner import ImageResult, RunnerConfig, RunSummary, run_pipeline


def list_inputs(inputs: str | Path | Sequence[str | Path]) -> list[Path]:
    """A folder's image files (sorted by name, not recursive) or the given paths as they are."""
    from gpen_tune.imageio import INPUT_EXTENSIONS

    if isinstance(inputs, str | Path) and Path(inputs).is_dir():
        return sorted(p for p in Path(inputs).iterdir()
                      if p.is_file() and p.suffix.lower().lstrip(".") in INPUT_EXTENSIONS)
    if isinstance(inputs, str | Path):
        return [Path(inputs)]
    return [Path(p) for p in inputs]


def enhance_folder(
    inputs: str | Path | Sequence[str | Path],
    outdir: str | Path,
    settings: Any = None,
    *,
    enhancer: Any = None,
    restore: Callable | None = None,
    workers: int | None = None,
    prepare_workers: int | None = None,
    max_batch: int | None = None,
    max_wait_ms: float = 5.0,
    max_inflight: int | None = None,
    paste: str = "auto",
    detect_batch: int = 1,
    ext: str | None = None,
    suffix: str = "",
    stems: Sequence[str] | None = None,
    save_faces: bool = False,
    save_comparison: bool = False,
    serial: bool = False,
    bucket_batches: bool = True,
    detector_process: bool = False,
    on_result: Callable[[ImageResult], None] | None = None,
) -> RunSummary:
    """Restore every face of every input, faces batched across images; outputs named as the serial path.

    Args:
        inputs: a folder, a file or a list of files.
        outdir: output folder (created).
        settings: `gpen_tune.face.pipeline.EnhanceSettings` (model, weights, detector, device, strength, ...).
        enhancer: an Enhancer to reuse (its model, detector and restore callable); built from settings if None.
        restore: the generator callable (e.g. the tune part's `build_restorer(...)`) when building the enhancer.
        workers: threads per CPU stage (default: half the cores, 1..8).
        prepare_workers: decode/detect/align threads (default: 6 x workers up to 48 on CUDA, where they mostly
            wait for the batched detector; else `workers`).
        max_batch: largest generator batch, a CUDA-graph bucket (default 32 on CUDA, settings.batch_size on CPU).
        max_wait_ms: how long a partial batch waits for faces from further images.
        max_inflight: images held in memory at once (default 4 x workers + 8).
        paste: "auto" | "cpu" | "gpu" paste-back (GPU only on CUDA with the default mask).
        detect_batch: images a prepare worker decodes and detects together (one batched detector call for
            same-size images; worth it with the detector on the GPU).
        serial: run the serial driver `enhance_paths` instead (the old path; same outputs).
        bucket_batches: batches of bucket sizes (1, 2, 4, ...); False takes up to max_batch at once (for a
            restorer that pads every batch to one shape; a compiled Restorer does that through its `take`).
        detector_process: the detector in a process of its own (`throughput.detect_process`) instead of a
            thread of this one. Opt-in (its start costs ~10 s); on an H200, 4,096 photos: 693 vs 625 faces/s
            (benchmarks/results/20261201-081014_*). Not with a lazy detector.
        on_result: called per image, in completion order, in the calling thread.
    Returns:
        RunSummary: per-image results in input order, wall time, per-stage timings.
    """
    from gpen_tune.face.pipeline import Enhancer, EnhanceSettings, OutputNaming

    paths = list_inputs(inputs)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    naming = OutputNaming(outdir, ext=ext, suffix=suffix)
    own = enhancer is None
    if own:
        enhancer = Enhancer(settings or EnhanceSettings(), restore=restore)
    try:
        if serial:
            return _serial(paths, naming, enhancer, stems, save_faces, save_comparison, on_result)
        from gpen_tune.restore.buckets import bucket_floor
        from gpen_tune.throughput.stages import EnhancerStages

        device = enhancer.device
        batch = max_batch or (32 if device.type == "cuda" else enhancer.settings.batch_size)
        restorer = enhancer.restorer
        restorer.limit = bucket_floor(batch)
        stages = EnhancerStages(enhancer, naming, paths, stems, paste, save_faces, save_comparison,
                                detector_process=detector_process)
        cfg = RunnerConfig(workers=workers, max_batch=batch, max_wait_ms=max_wait_ms, max_inflight=max_inflight,
                           bucket_batches=bucket_batches, detect_batch=detect_batch, prepare_workers=prepare_workers)
        return run_pipeline(paths, stages, restorer, cfg, on_result=on_result, before_restore=stages.before_restore,
                            restored_on_device=stages.device_paste_possible)
    finally:
        if own:
            enhancer.close()


def _serial(paths, naming, enhancer, stems, save_faces, save_comparison, on_result) -> RunSummary:
    """The serial driver, reported in the runner's terms (and interruptible the same way)."""
    from gpen_tune.face.pipeline import enhance_paths

    t0 = time.perf_counter()
    results: list[ImageResult] = []

    def on_job(job: Any) -> None:
        i = len(results)
        ok = job.status != "error"
        r = ImageResult(i, paths[i], "ok" if ok else "failed", output=job.output, faces=len(job.faces),
                        error=job.error, job=job)
        results.append(r)
        if on_result is not None:
            on_result(r)

    interrupted = False
    try:
        enhance_paths(paths, naming, enhancer, stems=stems, on_job=on_job, save_faces=save_faces,
                      save_comparison=save_comparison)
    except KeyboardInterrupt:
        interrupted = True
    results += [ImageResult(i, p, "dropped", error="interrupted") for i, p in enumerate(paths) if i >= len(results)]
    stages: dict[str, Any] = {}
    for r in results:
        for k, v in (getattr(r.job, "timings", None) or {}).items():
            stages[f"{k}_s"] = stages.get(f"{k}_s", 0.0) + v
    return RunSummary(results, time.perf_counter() - t0, interrupted, stages)


class JobList(list):
    """`ImageJob`s in input order (what `enhance_paths` returns) plus how the run ended."""

    interrupted: bool = False
    summary: RunSummary | None = None


def run_jobs(
    files: Sequence[tuple[Path, str]],
    naming: Any,
    enhancer: Any,
    *,
    on_job: Callable[[Any], None] | None = None,
    save_faces: bool = False,
    save_comparison: bool = False,
    workers: int | None = None,
    serial: bool = False,
    paste: str = "auto",
    detector_process: bool = False,
) -> JobList:
    """The CLI's entry: `enhance_paths`' contract (jobs in input order, `on_job` per image) on the pipelined runner.

    Several inputs go through the runner (faces batched across images, `enhancer.settings.batch_size` faces per
    generator call at most); one input, or `serial=True`, runs the serial driver. Images not processed because of
    Ctrl-C come back as failed jobs ("not processed (interrupted)") and `.interrupted` is set.
    `detector_process`: the runner's detector in a process of its own (see `enhance_folder`).
    """
    from gpen_tune.face.pipeline import ImageJob, enhance_paths

    paths = [Path(p) for p, _ in files]
    stems = [s for _, s in files]
    jobs = JobList()
    if serial or len(paths) <= 1:
        try:
            jobs.extend(enhance_paths(paths, naming, enhancer, stems=stems, on_job=on_job, save_faces=save_faces,
                                      save_comparison=save_comparison))
        except KeyboardInterrupt:
            jobs.interrupted = True
        return jobs
    from gpen_tune.restore.buckets import bucket_floor
    from gpen_tune.throughput.stages import EnhancerStages

    restorer = enhancer.restorer                 # pads to one shape when compiled (its `take` knows)
    restorer.limit = min(restorer.limit, bucket_floor(enhancer.settings.batch_size))
    stages = EnhancerStages(enhancer, naming, paths, stems, paste, save_faces, save_comparison,
                            detector_process=detector_process)

    def as_job(r: ImageResult) -> Any:
        if r.job is not None:
            return getattr(r.job, "job", r.job)
        return ImageJob(source=str(r.path), status="error",
                        error=r.error if r.status == "failed" else f"{r.path}: not processed (interrupted)")

    def on_result(r: ImageResult) -> None:
        if on_job is not None and r.status != "dropped":
            on_job(as_job(r))

    summary = run_pipeline(paths, stages, restorer, RunnerConfig(workers=workers, max_batch=restorer.limit),
                           on_result=on_result, before_restore=stages.before_restore,
                           restored_on_device=stages.device_paste_possible)
    jobs.extend(as_job(r) for r in summary.results)
    jobs.interrupted = summary.interrupted
    jobs.summary = summary
    return jobs
