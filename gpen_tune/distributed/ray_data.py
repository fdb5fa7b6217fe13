"""Clusters through Ray Data: the pipeline's steps as stages of one streaming dataset.

    paths ──> Prepare (CPU actors: steps.prepare) ──> Restore (GPU actors: steps.restore, generator + parse mask)
          ──> Finish (CPU actors: steps.finish, paste, encode, write to OUT) ──> one result row per input

    result = ray_enhance(["albums/"], "s3://bucket/restored", settings, tune, address="auto",
                         options=RayOptions(concurrency=8, cpu_concurrency=48))

Why these cuts: decode/detect/align and paste/encode are CPU work that scales with CPU actors, the generator is
GPU work that wants big batches on few long-lived actors (a CUDA graph per actor). Between stages the job travels
whole (pickled in its row: the decoded picture, the face crops, then their restorations and parse masks), so each
image is decoded once. Every stage drives the three calls of `gpen_tune.pipeline.steps` as the plain run does
(`prepare`, `restore` in the restorer's batches, `finish` into a `FileSink`), so the outputs equal the plain
run's; a bad file fails in its row, alone, with the plain run's one line.

Fault tolerance is Ray Data's: an actor of a pool that dies is restarted and its task retried (Ray Data's
defaults for actor pools, unlimited restarts and task retries, are kept); a retried finish task writes the same
file again through a temp name + rename (local) or a temp object + move (pyarrow filesystems), so a killed worker
never leaves a partial output. OUT is a local folder or any URL
`pyarrow.fs.FileSystem.from_uri` understands (s3://, gs://, hdfs://, file://). Inputs are local paths (on a
cluster: a filesystem every node mounts at the same path). Videos run without --ray (a video needs its frames in
order through one tracker and one encoder).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpen_tune.distributed.ray_import import check_address, import_ray
from gpen_tune.face.detect import Detection, default_notify, init_detector
from gpen_tune.model.configs import model_info
from gpen_tune.pipeline.api import EnhanceResult, Pipeline
from gpen_tune.pipeline.job import FaceCrop, ImageJob, one_line
from gpen_tune.pipeline.outputs import OutputNaming, check_output_dir, collect_inputs, is_video, plan_outputs
from gpen_tune.pipeline.scheduler import RunSummary, dropped
from gpen_tune.pipeline.settings import EnhanceSettings, resolve_weights
from gpen_tune.pipeline.sinks import FileSink
from gpen_tune.pipeline.sources import FileSource, Source
from gpen_tune.pipeline.steps import Steps
from gpen_tune.tune.options import TuneConfig


@dataclass(frozen=True)
class RayOptions:
    """How the dataset is spread. Sizing: docs/ray.md.

    address: a running cluster ("auto", "ray://host:10001"); None starts a local Ray with `num_cpus`.
    num_gpus_per_actor: GPUs of one restore actor (1 for GPEN-512 bf16; 0 runs it on the CPU, e.g. in tests); the
    restore actors run on "cuda" when it is above 0, else on "cpu".
    concurrency: restore actors (None: the cluster's GPUs / num_gpus_per_actor, at least 1).
    batch_size: images per restore call (their faces are restored in the restorer's batches of
    `settings.batch_size`). cpu_concurrency: prepare actors and finish actors each
    (None: the CPUs left over, halved). cpus_per_actor: CPUs Ray reserves for each actor (lowered so that all
    the actors fit in the cluster's CPUs).
    """

    address: str | None = None
    num_cpus: int | None = None
    num_gpus_per_actor: float = 1.0
    concurrency: int | None = None
    batch_size: int = 8
    cpu_concurrency: int | None = None
    cpus_per_actor: float = 1.0


# ---------------------------------------------------------------------------------------------------- stages


def _table(rows: list[dict[str, Any]]) -> Any:
    import pyarrow as pa  # optional: comes with ray[data]

    return pa.Table.from_pylist(rows)


def _cpu_steps(settings: EnhanceSettings, tune: TuneConfig, **parts: Any) -> Steps:
    """The steps of a CPU stage: no restorer, faces cut and pasted on the host."""
    return Steps(settings, size=model_info(settings.model).config.size, device=torch.device("cpu"),
                 face_crop=tune.face_crop, cut_on_device=False, **parts)


def _jobs(rows: list[dict[str, Any]]) -> list[ImageJob]:
    return [pickle.loads(row["job"]) for row in rows]


def _store(rows: list[dict[str, Any]], jobs: list[ImageJob]) -> Any:
    for row, job in zip(rows, jobs, strict=True):
        row.update(status=job.status, error=job.error, job=pickle.dumps(job))
    return _table(rows)


class Prepare:
    """CPU actor: `steps.prepare` (decode, detect with an inline detector of its own, align, cut on the host)."""

    def __init__(self, settings: EnhanceSettings, tune: TuneConfig):
        detector = None if settings.aligned else init_detector(
            settings.detector, device=torch.device("cpu"), weights=settings.detector_weights,
            threshold=settings.det_threshold, det_size=settings.det_size, service="inline")
        self.steps = _cpu_steps(settings, tune, detector=detector)

    def __call__(self, batch: Any) -> Any:
        rows = batch.to_pylist()
        jobs = [ImageJob(source=r["path"], index=r["index"], stem=r["stem"], load=lambda p=r["path"]: p)
                for r in rows]
        return _store(rows, self.steps.prepare(jobs))


class Restore:
    """GPU actor: `steps.restore` over the faces of a batch of images, in the restorer's batches (the generator
    behind its switches and the parse mask, as `Pipeline` builds them)."""

    def __init__(self, settings: EnhanceSettings, tune: TuneConfig):
        self.pipeline = Pipeline(settings, tune, notify=lambda _msg: None)
        self.steps = self.pipeline.steps(service=None)

    def __call__(self, batch: Any) -> Any:
        rows = batch.to_pylist()
        jobs = _jobs(rows)
        faces = [face for job in jobs for face in job.unrestored()]
        limit = self.steps.restorer.limit
        while faces:
            part, faces = faces[:limit], faces[limit:]
            self.steps.restore(part).collect()
            limit = self.steps.restorer.limit          # an OOM may have lowered it
        return _store(rows, jobs)


class Finish:
    """CPU actor: `steps.finish` (paste, encode and write the output atomically), then the file onto OUT."""

    def __init__(self, settings: EnhanceSettings, tune: TuneConfig, naming: OutputNaming, remote: str | None,
                 save_faces: bool, save_comparison: bool):
        self.remote = remote
        self.staging = Path(tempfile.mkdtemp(prefix="gpen-tune-ray-")) if remote else None
        local = naming if remote is None else OutputNaming(self.staging, naming.ext, naming.suffix, naming.pattern,
                                                                   naming.replace)
        self.steps = _cpu_steps(settings, tune, sink=FileSink(local, save_faces, save_comparison,
                                                              png_level=settings.png_level),
                                save_faces=save_faces)

    def __call__(self, batch: Any) -> Any:
        if self.staging is None:
            return self._finish(batch)
        self.staging.mkdir(parents=True, exist_ok=True)
        try:
            return self._finish(batch)
        finally:          # between batches nothing is staged: an actor ended by the cluster leaves no folder
            shutil.rmtree(self.staging, ignore_errors=True)

    def _finish(self, batch: Any) -> Any:
        rows = batch.to_pylist()
        for row, job in zip(rows, _jobs(rows), strict=True):
            del row["job"]
            self.steps.finish(job)
            output = job.output
            if output is not None and self.remote:
                try:
                    output = self._publish(output)
                except (OSError, ValueError) as e:
                    job.fail(one_line(job.source, e))
                    output = None
            row.update(status=job.status, error=job.error, timings=json.dumps(job.timings),
                       size=json.dumps(job.size), output=None if output is None else str(output),
                       detections=json.dumps([None if f.detection is None else f.detection.to_dict()
                                              for f in job.faces]))
        return _table(rows)

    def _publish(self, staged: Path) -> str:
        """A staged file (and its side files) onto the remote filesystem: temp object, then move."""
        from pyarrow import fs as pafs  # optional: comes with ray[data]

        filesystem, root = pafs.FileSystem.from_uri(self.remote)
        target = None
        for path in sorted(p for p in self.staging.rglob("*") if p.is_file()):
            rel = path.relative_to(self.staging).as_posix()
            final = f"{root.rstrip('/')}/{rel}"
            tmp = f"{root.rstrip('/')}/{Path(rel).parent.as_posix()}/.{path.name}.{os.getpid()}.part"
            filesystem.create_dir(final.rsplit("/", 1)[0], recursive=True)
            with filesystem.open_output_stream(tmp) as f:
                f.write(path.read_bytes())
            filesystem.move(tmp, final)
            path.unlink()
            if path == staged:
                target = f"{self.remote.rstrip('/')}/{rel}"
        return target or str(staged)


# ---------------------------------------------------------------------------------------------------- driver


def _is_url(outdir: str | Path) -> bool:
    return "://" in str(outdir)


def _plan_remote(files: list[tuple[Path, str]], naming: OutputNaming, url: str, existing: str) -> Any:
    """The plain run's planning against an empty staging folder, then existence checked on the filesystem."""
    from pyarrow import fs as pafs  # optional: comes with ray[data]

    filesystem, root = pafs.FileSystem.from_uri(url)
    with tempfile.TemporaryDirectory(prefix="gpen-tune-plan-") as staging:
        local = OutputNaming(Path(staging), naming.ext, naming.suffix, naming.pattern, naming.replace)
        plan = plan_outputs(files, local, existing)
        rel = {i: local.planned(files[i][1], files[i][0]).relative_to(staging).as_posix() for i in plan.run}
    infos = filesystem.get_file_info([f"{root.rstrip('/')}/{r}" for r in rel.values()])
    for (i, r), info in zip(list(rel.items()), infos, strict=True):
        if info.type == pafs.FileType.NotFound:
            continue
        target = f"{url.rstrip('/')}/{r}"
        plan.run.remove(i)
        if existing == "skip":
            plan.skipped[i] = f"{target} exists (--skip-existing)"
        elif existing == "refuse":
            plan.refused[i] = (f"{files[i][0]}: output {target} already exists: pass --overwrite to replace it or "
                               "--skip-existing to keep it")
        else:
            plan.run.append(i)
    plan.run.sort()
    return plan


def _job_from_row(row: dict[str, Any]) -> ImageJob:
    job = ImageJob(source=row["path"], index=row["index"], stem=row["stem"])
    job.status, job.error = row["status"], row["error"]
    job.output = Path(row["output"]) if row.get("output") and not _is_url(row["output"]) else row.get("output")
    size = json.loads(row.get("size") or "null")
    job.size = tuple(size) if size else None
    job.timings = json.loads(row["timings"])
    blank = np.zeros((2, 3))
    job.faces = [FaceCrop(None, blank, blank, None if d is None else Detection(
        np.array(d["box"]), d["score"], np.array(d["landmarks"]))) for d in json.loads(row["detections"])]
    return job


class RayPool:
    """Ray Data as the executor of the three calls, behind the part of the `Pipeline` interface that `enhance` and
    the CLI use (`run`, `prepare`, `close`, `settings`, `device`, `restorer`, `weights_source`), as `DevicePool`:
    photo files into a `FileSink`'s folder (`ray_enhance` adds filesystem URLs). A video needs one tracker and one
    encoder: `run` refuses it. Ray is started on first use (`options.address`'s cluster, or a local one that
    `close` shuts down again; a Ray the caller initialised is left running)."""

    def __init__(self, settings: EnhanceSettings | None = None, tune: TuneConfig | None = None, *,
                 options: RayOptions = RayOptions(), notify: Callable[[str], None] = default_notify):
        settings = settings or EnhanceSettings()
        # the weights as this machine sees them (the plain run's notice when synthetic); the nodes need the same file
        self.settings = replace(settings, weights=resolve_weights(settings, notify))
        self.tune = tune or TuneConfig()
        self.options = options
        self.device = torch.device("cuda" if options.num_gpus_per_actor else "cpu")
        self.restorer = None                           # the restorers live in the actors
        self.weights_source = self.settings.weights
        self._started = False

    def prepare(self) -> str | None:
        return None if self.settings.aligned else self.settings.detector

    def close(self) -> None:
        if self._started:
            import_ray().shutdown()
            self._started = False

    def __enter__(self) -> RayPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ray(self) -> Any:
        ray = import_ray()
        if not ray.is_initialized():
            check_address(self.options.address)
            ray.init(address=self.options.address,
                     num_cpus=self.options.num_cpus if self.options.address is None else None,
                     include_dashboard=False, log_to_driver=False)
            self._started = True
        return ray

    def run(self, source: Source, sink: FileSink, *, serial: bool = False, config: Any = None,
            on_result: Callable[[ImageJob], None] | None = None, on_faces: Callable[[int], None] | None = None,
            save_faces: bool = False, tracker: Any = None, save_mask: bool = False,
            remote: str | None = None) -> RunSummary:
        """Every photo of `source` through the dataset into `sink`'s folder (or `remote`, a filesystem URL, staged
        through it); results in source order. `serial`, `config` and `save_mask` do not apply here."""
        if tracker is not None or not isinstance(sink, FileSink):
            raise ValueError("videos run without --ray (one tracker and one encoder per video): run them with "
                             "--devices or one GPU")
        t0 = time.perf_counter()
        items = list(source)
        rows = [{"index": i, "path": item.name, "stem": item.stem} for i, item in enumerate(items)]

        def done(job: ImageJob) -> None:             # faces are known per image once it is written
            if job.status == "ok" and on_faces is not None:
                on_faces(job.face_count)
            if on_result is not None:
                on_result(job)

        results, interrupted = _run_dataset(self._ray() if rows else None, rows, self.settings, self.tune,
                                            sink.naming, remote, self.options, sink.save_faces,
                                            sink.save_comparison, done)
        by_index = {job.index: job for job in results}
        jobs = [by_index.get(i) or dropped(i, item) for i, item in enumerate(items)]
        return RunSummary(jobs, time.perf_counter() - t0, interrupted, {"mode": "ray"})


def ray_enhance(inputs: str | Path | Sequence[str | Path], outdir: str | Path, settings: EnhanceSettings | None = None,
                tune: TuneConfig | None = None, *, options: RayOptions = RayOptions(), recursive: bool = False,
                ext: str | None = None, suffix: str = "", name_pattern: str = "{name}{suffix}.{ext}",
                existing: str = "refuse", save_faces: bool = False, save_comparison: bool = False,
                on_result: Callable[[ImageJob], None] | None = None, on_faces: Callable[[int], None] | None = None,
                on_start: Callable[[int], None] | None = None, pool: RayPool | None = None,
                notify: Callable[[str], None] = default_notify) -> EnhanceResult:
    """`gpen_tune.enhance` on Ray Data: the same inputs, planning, outputs and result (see the module docstring);
    OUT may be a filesystem URL. `pool`: a `RayPool` to run on (default: one made here from `settings`, `tune`
    and `options`, closed at the end).

    Raises MissingPart (one line) without Ray."""
    import_ray()
    own = pool is None
    pool = pool or RayPool(settings, tune, options=options, notify=notify)
    names = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    found = collect_inputs([str(n) for n in names], recursive)
    remote = str(outdir) if _is_url(outdir) else None
    naming = OutputNaming(Path(tempfile.gettempdir()) if remote else Path(outdir), ext=ext, suffix=suffix,
                          pattern=name_pattern, replace=existing == "overwrite")
    if remote:
        plan = _plan_remote(found.files, naming, remote, existing)
    else:
        check_output_dir(naming.outdir)
        plan = plan_outputs(found.files, naming, existing)
    refused = [_planned_job(i, found.files[i], "error", msg) for i, msg in plan.refused.items()]
    skipped = [_planned_job(i, found.files[i], "skipped", msg) for i, msg in plan.skipped.items()]
    videos = [_planned_job(i, found.files[i], "error", f"{found.files[i][0]}: videos run without --ray (one "
                           "tracker and one encoder per video): run them with --devices or one GPU")
              for i in plan.run if is_video(found.files[i][0])]
    photos = [i for i in plan.run if not is_video(found.files[i][0])]
    if on_start is not None:
        on_start(len(photos))
    try:
        summary = pool.run(FileSource([found.files[i][0] for i in photos], [found.files[i][1] for i in photos]),
                           FileSink(naming, save_faces, save_comparison), on_result=on_result, on_faces=on_faces,
                           remote=remote)
    finally:
        if own:
            pool.close()
    for job in summary.results:                    # back to the numbering of all inputs
        job.index = photos[job.index]
    summary.results = sorted(summary.results + videos, key=lambda j: j.index)
    return EnhanceResult(summary, found.missing, found.passed_over, refused, skipped)


def _run_dataset(ray: Any, rows: list[dict[str, Any]], settings: EnhanceSettings, tune: TuneConfig,
                 naming: OutputNaming, remote: str | None, options: RayOptions, save_faces: bool,
                 save_comparison: bool, on_result: Callable[[ImageJob], None] | None) -> tuple[list[ImageJob], bool]:
    """The dataset's result rows as jobs (each input once), and whether Ctrl-C stopped it."""
    if not rows:
        return [], False
    resources = ray.cluster_resources()
    gpus = options.num_gpus_per_actor
    restore_actors = options.concurrency or max(1, int(resources.get("GPU", 0) // gpus) if gpus else 1)
    cpus = resources.get("CPU", 1.0)
    cpu_actors = options.cpu_concurrency or max(1, int(cpus - restore_actors) // 2)
    per_actor = min(options.cpus_per_actor, cpus / (restore_actors + 2 * cpu_actors))
    settings = replace(settings, device="cuda" if gpus else "cpu")
    def pool(n: int) -> Any:
        return ray.data.ActorPoolStrategy(size=n)

    common = {"batch_format": "pyarrow", "fn_constructor_kwargs": {"settings": settings, "tune": tune}}
    ds = ray.data.from_items(rows, override_num_blocks=min(len(rows), 2000))
    ds = ds.map_batches(Prepare, batch_size=1, compute=pool(cpu_actors), num_cpus=per_actor, **common)
    ds = ds.map_batches(Restore, batch_size=options.batch_size, compute=pool(restore_actors), num_gpus=gpus or None,
                        num_cpus=per_actor, **common)
    finish_args = {**common["fn_constructor_kwargs"], "naming": naming, "remote": remote, "save_faces": save_faces,
                   "save_comparison": save_comparison}
    ds = ds.map_batches(Finish, batch_size=1, compute=pool(cpu_actors), num_cpus=per_actor,
                        batch_format="pyarrow", fn_constructor_kwargs=finish_args)
    jobs: dict[int, ImageJob] = {}
    try:
        for row in ds.iter_rows():
            job = _job_from_row(row)
            if job.index in jobs:                    # a retried task's row again: the same file, counted once
                continue
            jobs[job.index] = job
            if on_result is not None:
                on_result(job)
    except KeyboardInterrupt:                        # files written so far are complete (atomic writes)
        return list(jobs.values()), True
    return list(jobs.values()), False


def _planned_job(index: int, file: tuple[Path, str], status: str, message: str) -> ImageJob:
    job = ImageJob(source=str(file[0]), index=index, stem=file[1])
    job.status, job.error = status, message
    return job
