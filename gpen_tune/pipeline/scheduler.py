"""The scheduler: runs a source's items through the three calls of `gpen_tune.pipeline.steps` (prepare, restore,
finish: the sink is the steps'). It only schedules.

    serial    the calls inline, a few images at a time: prepare them, restore all their faces in batches
              across images, finish each (one thread; what a single image, a CPU of few cores and `--serial`
              use: `serial_by_default`)
    threaded  the same calls on threads (gpen_tune.pipeline.threads): prepare workers -> one GPU stage
              batching faces across images -> finish workers; bounded queues and in-flight slots

Both return a `RunSummary` whose `results` are the `ImageJob`s in source order. Failures are per image (the
job's status "error", one line naming the input); Ctrl-C stops new work, lets writes in progress complete
(writes are atomic) and returns with `interrupted` set, the images not processed marked "dropped".
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpen_tune.pipeline.job import IMAGE_ERRORS, ImageJob, one_line
from gpen_tune.pipeline.sources import Source, SourceItem
from gpen_tune.pipeline.steps import FaceRef, Steps
from gpen_tune.tune.hardware import usable_cores

SERIAL_IMAGES_PER_STEP = 8       # images prepared together on the serial path (their faces share batches)
SERIAL_MAX_CPU_CORES = 2         # few_cpu_cores: CPUs with at most this many usable cores run serially


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

    @property
    def threads_given(self) -> bool:
        """Whether the caller set any thread count (then it asked for the threaded scheduler)."""
        return any(v is not None for v in (self.workers, self.prepare_workers, self.torch_threads))

    def cpu_threads(self, cores: int | None = None) -> int:
        """torch's intra-op threads while a threaded run uses the CPU as its device: the generator stage and the
        detector thread call torch at the same time, each with this many threads, so together they fill the
        cores and never oversubscribe them (2 x threads <= cores; on 2 cores: one each). The serial path keeps
        torch's own setting (all cores): there the two never run at once."""
        if self.torch_threads is not None:
            return max(1, self.torch_threads)
        return max(1, (cores or usable_cores()) // TORCH_CALLERS)


def serial_by_default(items: int, device_type: str, config: SchedulerConfig | None = None,
                      cores: int | None = None) -> bool:
    """Whether a run of `items` photos takes the serial path when the caller does not say: one photo (nothing to
    overlap), else as `few_cpu_cores` says."""
    return items <= 1 or few_cpu_cores(device_type, config, cores)


def few_cpu_cores(device_type: str, config: SchedulerConfig | None = None, cores: int | None = None) -> bool:
    """Whether a run of many photos or video frames takes the serial path when the caller does not say: the CPU as
    the device with at most SERIAL_MAX_CPU_CORES usable cores, and no thread count in `config`. A threaded CPU run
    gives the detector and the generator half the cores each (`cpu_threads`); on 2 cores both run about twice as
    fast on two threads as on one, so the overlap does not pay for the split: 36 photos, GPEN-BFR-256, 7.53
    faces/s threaded against 8.11 serial; a 9-face video 0.48-0.53 against 0.77-0.78 fps (benchmarks/RESULTS.md,
    "A folder or a video on a 2-core CPU")."""
    if config is not None and config.threads_given:
        return False
    return device_type == "cpu" and (cores or usable_cores()) <= SERIAL_MAX_CPU_CORES


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
    return ImageJob(source=item.name, index=index, stem=item.stem, meta=item.meta, load=item.load)


def dropped(index: int, item: SourceItem) -> ImageJob:
    job = ImageJob(source=item.name, index=index, stem=item.stem, meta=item.meta)
    job.status, job.error = "dropped", f"{item.name}: not processed (interrupted)"
    return job


def run_serial(source: Source, steps: Steps, *, batch_size: int | None = None,
               images_per_step: int = SERIAL_IMAGES_PER_STEP,
               on_result: Callable[[ImageJob], None] | None = None,
               on_faces: Callable[[int], None] | None = None) -> RunSummary:
    """The three calls inline: a few images prepared together, their faces restored in batches of `batch_size`
    (default: the restorer's limit) across images, then each image finished (pasted and written) in order."""
    t0 = time.perf_counter()
    results: list[ImageJob] = []
    items: Iterator[SourceItem] = iter(source)
    interrupted = False
    pending: list[tuple[int, SourceItem]] = []
    try:
        index = 0
        while step := list(itertools.islice(items, images_per_step)):
            pending = list(enumerate(step, start=index))
            index += len(step)
            jobs = [new_job(i, it) for i, it in pending]
            try:
                steps.prepare(jobs)
            except IMAGE_ERRORS as e:                # the detector's call, as the threaded scheduler's group
                for job in jobs:
                    job.fail(one_line(job.source, e))
            _restore_inline(steps, [f for job in jobs for f in job.unrestored()], batch_size, on_faces)
            for job in jobs:
                steps.finish(job)
                results.append(job)
                pending = pending[1:]
                if on_result is not None:
                    on_result(job)
    except KeyboardInterrupt:
        interrupted = True
        results += [dropped(i, it) for i, it in pending]
        results += [dropped(i, it) for i, it in enumerate(items, start=len(results))]
    return RunSummary(results, time.perf_counter() - t0, interrupted, {"mode": "serial"})


def _restore_inline(steps: Steps, faces: list[FaceRef], batch_size: int | None,
                    on_faces: Callable[[int], None] | None) -> None:
    """Generator batches of `batch_size` faces, each in parts of the restorer's limit (an OOM may lower it)."""
    chunk = batch_size or steps.restorer.limit
    for start in range(0, len(faces), chunk):
        todo = faces[start:start + chunk]
        while todo:
            part, todo = todo[:steps.restorer.limit], todo[steps.restorer.limit:]
            batch = steps.restore(part)
            batch.collect()
            if on_faces is not None and batch.error is None:
                on_faces(len(part))
