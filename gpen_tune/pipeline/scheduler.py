"""The scheduler: runs a source's items through `Stages` and the `Restorer` into a sink. It only schedules.

    serial    the stages inline, a few images at a time: prepare them, restore all their faces in batches
              across images, finish and write each (one thread; what a single image and `--serial` use)
    threaded  the same calls on threads (gpen_tune.pipeline.threads): prepare workers -> one GPU stage
              batching faces across images -> finish workers; bounded queues and in-flight slots

Both return a `RunSummary` whose `results` are the `ImageJob`s in source order. Failures are per image (the
job's status "error", one line naming the input); Ctrl-C stops new work, lets writes in progress complete
(writes are atomic) and returns with `interrupted` set, the images not processed marked "dropped".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.sinks import Sink
from gpen_tune.pipeline.sources import Source, SourceItem
from gpen_tune.pipeline.stages import IMAGE_ERRORS, Stages, one_line
from gpen_tune.tune.hardware import usable_cores

SERIAL_IMAGES_PER_STEP = 8       # images prepared together on the serial path (their faces share batches)


@dataclass(frozen=True)
class SchedulerConfig:
    """Knobs of the threaded scheduler; None picks a default from the machine."""

    workers: int | None = None            # finish (paste/encode) threads; prepare threads too off CUDA
    prepare_workers: int | None = None    # decode/detect/align threads (default: see `resolved`)
    max_wait_ms: float = 5.0              # how long a partial batch waits for more faces (device idle)
    max_inflight: int | None = None       # images between "prepare started" and "result posted"
    detect_batch: int = 1                 # images a prepare worker takes at once (one batched detector call)
    torch_threads: int | None = None      # torch intra-op threads of a threaded run on the CPU (see cpu_threads)

    def resolved(self, device_type: str) -> tuple[int, int, int]:
        """(workers, prepare_workers, max_inflight) with the defaults filled in.

        On CUDA the prepare threads mostly wait for the one detector thread, and the number waiting is the
        detector's batch: 6x the finish threads (at most 48) keeps its batches large (H200, 256 photos, preset
        speed: 12 / 24 / 48 threads -> 227 / 273 / 337 faces/s, benchmarks/results/20261130-224513, -224448,
        -224536). Elsewhere one per finish thread."""
        workers = self.workers or default_workers()
        prepare = self.prepare_workers or (min(48, 6 * workers) if device_type == "cuda" else workers)
        inflight = self.max_inflight or max(8, 2 * prepare + 2 * workers + 8)
        return workers, prepare, inflight


    def cpu_threads(self, cores: int | None = None) -> int:
        """torch's intra-op threads while a threaded run uses the CPU as its device: the generator stage and the
        detector thread call torch at the same time, each with this many threads, so together they fill the
        cores and never oversubscribe them (2 x threads <= cores; on 2 cores: one each). The serial path keeps
        torch's own setting (all cores): there the two never run at once."""
        if self.torch_threads is not None:
            return max(1, self.torch_threads)
        return max(1, (cores or usable_cores()) // TORCH_CALLERS)


TORCH_CALLERS = 2                # threads of a threaded CPU run that call torch at once: generator, detector


def default_workers(cpu_count: int | None = None) -> int:
    """Half the cores per CPU stage (prepare and finish run at the same time), 1..8."""
    cpus = cpu_count or os.cpu_count() or 1
    return max(1, min(8, cpus // 2))


@dataclass
class RunSummary:
    """Jobs in source order plus what each stage spent (for the benchmarks' "which stage limits")."""

    results: list[ImageJob]
    wall_s: float
    interrupted: bool = False
    stages: dict[str, Any] = field(default_factory=dict)

    def count(self, *statuses: str) -> int:
        return sum(j.status in statuses for j in self.results)

    @property
    def ok(self) -> int:
        return self.count("ok", "no_face")

    @property
    def failed(self) -> int:
        return self.count("error")

    @property
    def dropped(self) -> int:
        return self.count("dropped")

    @property
    def faces(self) -> int:
        return sum(j.face_count for j in self.results if j.status == "ok")

    def line(self) -> str:
        text = (f"{self.ok} written, {self.failed} failed, {self.dropped} not processed; {self.faces} faces in "
                f"{self.wall_s:.1f} s")
        return text + (" (interrupted)" if self.interrupted else "")


def new_job(index: int, item: SourceItem) -> ImageJob:
    return ImageJob(source=item.name, index=index, stem=item.stem, meta=item.meta)


def dropped(index: int, item: SourceItem) -> ImageJob:
    job = new_job(index, item)
    job.status, job.error = "dropped", f"{item.name}: not processed (interrupted)"
    return job


def finish_and_write(stages: Stages, sink: Sink, job: ImageJob, restored: list, restored_device=None) -> None:
    """Paste, then write unless the sink takes jobs in order (the scheduler writes those itself)."""
    try:
        stages.finish(job, restored, restored_device)
        if not sink.ordered:
            sink.write(job)
    except IMAGE_ERRORS as e:
        job.fail(one_line(job.source, e))


def write_in_order(sink: Sink, job: ImageJob) -> None:
    """An ordered sink gets every job, a failed one too (a video writes that frame as it came in); then the
    pixels are freed, the source item's meta (a decoded frame) included."""
    try:
        sink.write(job)
    except IMAGE_ERRORS as e:
        job.fail(one_line(job.source, e))
    job.release(meta=True)


def run_serial(source: Source, stages: Stages, restorer: Any, sink: Sink, *, batch_size: int | None = None,
               images_per_step: int = SERIAL_IMAGES_PER_STEP,
               on_result: Callable[[ImageJob], None] | None = None,
               on_faces: Callable[[int], None] | None = None,
               before_restore: Callable[[], None] | None = None) -> RunSummary:
    """The stages inline: a few images prepared together, their faces restored in batches of `batch_size`
    (default: the restorer's limit) across images, then pasted and written one by one."""
    t0 = time.perf_counter()
    results: list[ImageJob] = []
    items: Iterator[SourceItem] = iter(source)
    interrupted = False
    pending: list[tuple[int, SourceItem]] = []
    try:
        index = 0
        while True:
            step = []
            for item in items:
                step.append((index, item))
                index += 1
                if len(step) == images_per_step:
                    break
            if not step:
                break
            pending = list(step)
            jobs = [new_job(i, it) for i, it in step]
            try:
                stages.prepare(jobs, [it.load for _, it in step])
            except IMAGE_ERRORS as e:                # the detector's call, as the threaded scheduler's group
                for job in jobs:
                    job.fail(one_line(job.source, e))
            if stages.tracker is not None:
                for job in jobs:
                    stages.sequence(job)
            _restore_inline(stages, restorer, jobs, batch_size or restorer.limit, before_restore, on_faces)
            for job in jobs:
                if job.status != "error":
                    finish_and_write(stages, sink, job, [f.restored for f in job.faces])
                if sink.ordered:
                    write_in_order(sink, job)
                job.release(meta=True)
                results.append(job)
                pending = pending[1:]
                if on_result is not None:
                    on_result(job)
    except KeyboardInterrupt:
        interrupted = True
        results += [dropped(i, it) for i, it in pending]
        results += [dropped(i, it) for i, it in enumerate(items, start=len(results))]
    return RunSummary(results, time.perf_counter() - t0, interrupted, {"mode": "serial"})


def _restore_inline(stages: Stages, restorer: Any, jobs: list[ImageJob], batch: int,
                    before_restore: Callable[[], None] | None, on_faces: Callable[[int], None] | None) -> None:
    faces = [(job, k, crop) for job in jobs if job.status != "error" for k, crop in enumerate(stages.crops(job))]
    for start in range(0, len(faces), batch):
        chunk = faces[start:start + batch]
        if before_restore is not None:
            before_restore()
        try:
            done = 0
            while done < len(chunk):                # in parts of the restorer's limit (an OOM may lower it)
                part = chunk[done:done + min(len(chunk) - done, restorer.limit)]
                _restore_part(stages, restorer, part)
                done += len(part)
        except IMAGE_ERRORS as e:
            for job, _, _ in chunk:
                job.fail(one_line(job.source, e))
            continue
        if on_faces is not None:
            on_faces(len(chunk))


def _restore_part(stages: Stages, restorer: Any, part: list[tuple[ImageJob, int, Any]]) -> None:
    """One generator batch and its parse masks (`Stages.parse_batch`, as the threaded GPU stage)."""
    t = time.perf_counter()
    pending = restorer.submit([c for _, _, c in part])
    submit_s = time.perf_counter() - t
    parse = stages.parse_batch([(job, k) for job, k, _ in part], pending.device_out, device_paste=False)
    t = time.perf_counter()
    out = pending.result()
    share = (submit_s + time.perf_counter() - t) / len(part)
    stages.keep_masks(parse, pending.device_out)
    for (job, k, _), restored in zip(part, out, strict=True):
        job.faces[k].restored = restored
        job.add_time("restore", share)
