"""Three-stage folder runner: CPU prepare workers -> one GPU batching stage -> CPU finish workers.

    feeder ──in_q──> prepare x N ──ready_q──> GPU stage ──finish_q──> finish x M ──result_q──> caller
     (decode, detect, align)      (faces of many images in      (paste back, encode,
                                   bucket-sized batches)          atomic write)

Why threads: cv2, numpy and torch release the GIL in their heavy calls, and one process keeps one copy of the
models. Memory stays flat whatever the folder size: an image holds an in-flight slot from the moment its
preparation starts until its result is posted, and there are at most `max_inflight` slots; every queue is
bounded as well. Results come back in input order.

Failures are per image: an exception in any stage marks that image failed and the others go on. A
KeyboardInterrupt (Ctrl-C in the main thread, or raised inside a stage) stops new work, lets the finish workers
complete the file they are writing (writes are atomic: temp file + os.replace), drops the rest and returns a
summary with `interrupted=True`.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpen_tune.restore.buckets import bucket_floor, default_batch_size
from gpen_tune.restore.restorer import Restorer
from gpen_tune.restore.staging import PendingBatch, StageTimes

_DONE = object()      # a prepare worker has no more input
_POLL_S = 0.05        # how often blocked threads look at the stop flag
_BUSY_POLL_S = 0.001  # how often a partial batch checks whether the device has become free
# GIL hand-over interval while the runner's threads work (CPython's default is 5 ms). The threads that drive the
# GPU (detector, generator) release the GIL at every host sync and cv2 call; with 16+ Python threads each re-take
# waited up to the default interval, which made a GPU detector call of ~4 images last ~200 ms in a folder run
# (H200, 20261130-194256 throughput run) against ~12 ms per image alone.
SWITCH_INTERVAL_S = 0.0002


class Stages(Protocol):
    """The per-image work the runner schedules; the serial path runs the same three calls in a loop."""

    def prepare(self, index: int, path: Path) -> Any:
        """Decode + detect + align: a job object holding the image and its aligned crops (thread-safe)."""

    def crops(self, job: Any) -> Sequence[Any]:
        """The job's aligned face crops, [S,S,3] uint8 RGB each (may be empty); device tensors when the stage cut
        them on the restorer's device."""

    def finish(self, job: Any, restored: list[np.ndarray], restored_device: list[Any] | None = None) -> Path | None:
        """Paste back + encode + atomic write; returns the written path (thread-safe).

        `restored` are host crops [S,S,3] uint8; `restored_device` the same crops on the device when the runner
        was asked to keep them there (GPU paste-back), else None."""


@dataclass(frozen=True)
class RunnerConfig:
    """Knobs of the folder runner; None picks a default from the machine."""

    workers: int | None = None            # threads per CPU stage (finish; prepare too unless set below)
    max_batch: int | None = None          # largest generator batch (rounded down to a CUDA-graph bucket)
    max_wait_ms: float = 5.0              # how long a partial batch waits for more faces (device idle)
    max_inflight: int | None = None       # images between "prepare started" and "result posted"
    bucket_batches: bool = True           # batches are bucket sizes; False: take up to the limit (padded restorer)
    detect_batch: int = 1                 # images a prepare worker takes at once (one batched detector call)
    prepare_workers: int | None = None    # decode/detect/align threads (default: see `resolved`)

    def resolved(self, device_type: str) -> tuple[int, int, int, int]:
        """(workers, prepare_workers, max_batch, max_inflight) with the defaults filled in.

        On CUDA the prepare threads mostly wait for the one detector thread (gpen_tune.throughput.detect_server),
        and the number waiting is the detector's batch: 6x the finish threads (at most 48) keeps its batches
        large (H200, 256 photos, preset speed: 12 / 24 / 48 threads -> 227 / 273 / 337 faces/s,
        benchmarks/results/20261130-224513, -224448, -224536). Elsewhere one per finish thread."""
        workers = self.workers or default_workers()
        prepare = self.prepare_workers or (min(48, 6 * workers) if device_type == "cuda" else workers)
        max_batch = self.max_batch or default_batch_size(device_type)
        inflight = self.max_inflight or max(8, 2 * prepare + 2 * workers + 8)
        return workers, prepare, bucket_floor(max_batch), inflight


def default_workers(cpu_count: int | None = None) -> int:
    """Half the cores per CPU stage (prepare and finish run at the same time), 1..8."""
    cpus = cpu_count or os.cpu_count() or 1
    return max(1, min(8, cpus // 2))


@dataclass
class ImageResult:
    """What happened to one input, in input order."""

    index: int
    path: Path
    status: str                 # "ok" | "failed" | "dropped" (not processed: the run was interrupted)
    output: Path | None = None
    faces: int = 0
    error: str | None = None
    job: Any = None             # the stage's job object when it got that far (reports, timings)


@dataclass
class RunSummary:
    """Results in input order plus what each stage spent (for the benchmark's 'which stage limits')."""

    results: list[ImageResult]
    wall_s: float
    interrupted: bool = False
    stages: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> int:
        return sum(r.status == "ok" for r in self.results)

    @property
    def failed(self) -> int:
        return sum(r.status == "failed" for r in self.results)

    @property
    def dropped(self) -> int:
        return sum(r.status == "dropped" for r in self.results)

    @property
    def faces(self) -> int:
        return sum(r.faces for r in self.results if r.status == "ok")

    def line(self) -> str:
        text = (f"{self.ok} written, {self.failed} failed, {self.dropped} not processed; {self.faces} faces in "
                f"{self.wall_s:.1f} s")
        return text + (" (interrupted)" if self.interrupted else "")


class _Counter:
    """Thread-safe counter with a high-water mark."""

    def __init__(self) -> None:
        self.value = 0
        self.peak = 0
        self._lock = threading.Lock()

    def add(self, k: int) -> None:
        with self._lock:
            self.value += k
            self.peak = max(self.peak, self.value)


class _Queue(queue.Queue):
    """A bounded queue that records its highest fill level."""

    def __init__(self, maxsize: int):
        super().__init__(maxsize)
        self.peak = 0

    def _put(self, item: Any) -> None:  # called under the queue's lock
        super()._put(item)
        self.peak = max(self.peak, len(self.queue))


@dataclass
class _JobState:
    index: int
    path: Path
    job: Any
    crops: Sequence[np.ndarray]
    restored: list[Any]
    remaining: int
    restored_device: list[Any] | None = None
    failed: bool = False


def run_pipeline(
    paths: Sequence[str | Path],
    stages: Stages,
    restorer: Restorer,
    config: RunnerConfig = RunnerConfig(),
    on_result: Callable[[ImageResult], None] | None = None,
    before_restore: Callable[[], None] | None = None,
    restored_on_device: bool = False,
) -> RunSummary:
    """Restore every path through `stages` with faces batched across images; results in input order.

    Args:
        paths: input files (their order is the order of the results).
        stages: prepare / crops / finish of the face pipeline (see `Stages`).
        restorer: the GPU stage (uint8 crops in, restored uint8 crops out); its `.limit` may drop on OOM.
        config: workers, batch and queue bounds.
        on_result: called in the calling thread for every image as its result arrives (progress bars).
        before_restore: called before each generator batch (the lazy detector's release hook).
        restored_on_device: hand `finish` the restored crops as device tensors ([S,S,3] uint8) for GPU paste.
    """
    run = _Run(list(map(Path, paths)), stages, restorer, config, before_restore, restored_on_device)
    import cv2

    threads = cv2.getNumThreads()
    if run.workers > 1:
        cv2.setNumThreads(1)     # the workers are the parallelism: no per-call OpenCV thread pools on top
    try:
        return run.execute(on_result)
    finally:
        cv2.setNumThreads(threads)


class _Run:
    def __init__(self, paths, stages, restorer, config, before_restore, restored_on_device):
        self.paths = paths
        self.stages = stages
        self.restorer = restorer
        self.workers, self.prepare_workers, max_batch, self.max_inflight = config.resolved(restorer.device.type)
        restorer.limit = min(restorer.limit, max_batch)
        restorer.times = StageTimes()                # this run's numbers (the restorer may have served others)
        self.max_wait = config.max_wait_ms / 1000.0
        self.detect_batch = max(1, config.detect_batch)
        self.take = restorer.take if config.bucket_batches else (lambda n, limit: min(n, limit))
        self.before_restore = before_restore
        self.on_device = restored_on_device
        self.stop = threading.Event()
        self.interrupted = threading.Event()
        self.slots = threading.Semaphore(self.max_inflight)
        self.inflight = _Counter()
        self.in_q = _Queue(self.prepare_workers)
        self.ready_q = _Queue(self.max_inflight)
        self.finish_q = _Queue(2 * self.workers)
        self.result_q: queue.Queue = queue.Queue()   # unbounded but holds at most max_inflight results
        self.t = {"prepare_s": 0.0, "finish_s": 0.0, "gpu_wait_input_s": 0.0, "gpu_wait_output_s": 0.0,
                  "gpu_stage_s": 0.0}
        self._t_lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _add_time(self, key: str, dt: float) -> None:
        with self._t_lock:
            self.t[key] += dt

    def _put(self, q: queue.Queue, item: Any) -> bool:
        """Blocking put that gives up when the run stops; True when the item went in."""
        while not self.stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue, timeout: float | None = None) -> Any:
        """Blocking get that returns None when the run stops (or `timeout` passes)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while not self.stop.is_set():
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.perf_counter())
            if wait <= 0:
                return None
            try:
                return q.get(timeout=wait)
            except queue.Empty:
                continue
        return None

    def _post(self, result: ImageResult) -> None:
        """Hand a finished image to the caller and free its in-flight slot."""
        self.result_q.put(result)
        self.inflight.add(-1)
        self.slots.release()

    def _fail(self, index: int, exc: BaseException) -> None:
        """One line naming the file: the exception's own message when it already does (ImageReadError)."""
        path = str(self.paths[index])
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if path not in msg:
            msg = f"{path}: {type(exc).__name__}" + (f": {msg}" if msg else "")
        self._post(ImageResult(index, self.paths[index], "failed", error=msg))

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Thread body wrapper: an interrupt raised inside a stage stops the whole run cleanly."""

        def body() -> None:
            try:
                fn()
            except KeyboardInterrupt:
                self.interrupted.set()
                self.stop.set()
            except BaseException:  # a bug in the runner itself: stop rather than hang
                traceback.print_exc()
                self.interrupted.set()
                self.stop.set()

        return body

    # -- threads ------------------------------------------------------------------------------------------------
    def _feeder(self) -> None:
        for index in range(len(self.paths)):
            while not self.slots.acquire(timeout=_POLL_S):
                if self.stop.is_set():
                    return
            if self.stop.is_set():
                self.slots.release()
                return
            self.inflight.add(1)
            if not self._put(self.in_q, index):
                return
        for _ in range(self.prepare_workers):
            if not self._put(self.in_q, None):
                return

    def _prepare_worker(self) -> None:
        try:
            last = False
            while not last:
                index = self._get(self.in_q)
                if index is None:   # end of input or stop
                    return
                group = [index]
                while len(group) < self.detect_batch:     # take what is already queued, never wait for more
                    try:
                        nxt = self.in_q.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is None:
                        last = True
                        break
                    group.append(nxt)
                t0 = time.perf_counter()
                try:
                    outcomes = self._prepare_group(group)
                finally:
                    self._add_time("prepare_s", time.perf_counter() - t0)
                for i, job in zip(group, outcomes, strict=True):
                    if isinstance(job, Exception):
                        self._fail(i, job)
                        continue
                    try:
                        crops = list(self.stages.crops(job))
                    except Exception as exc:
                        self._fail(i, exc)
                        continue
                    state = _JobState(i, self.paths[i], job, crops, [None] * len(crops), len(crops))
                    if not self._put(self.ready_q, state):
                        return
        finally:
            if not self.stop.is_set():
                self._put(self.ready_q, _DONE)

    def _prepare_group(self, group: list[int]) -> list[Any]:
        """Jobs (or the exception of each failed image) for a group of indices; one detector call when possible."""
        many = getattr(self.stages, "prepare_many", None)
        if len(group) > 1 and many is not None:
            try:
                return list(many(group, [self.paths[i] for i in group]))
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                return [exc] * len(group)
        out: list[Any] = []
        for i in group:
            try:
                out.append(self.stages.prepare(i, self.paths[i]))
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                out.append(exc)
        return out

    def _gpu_stage(self) -> None:
        pending: list[tuple[_JobState, int]] = []    # faces waiting for a batch, arrival order
        inflight: tuple[PendingBatch, list[tuple[_JobState, int]]] | None = None
        producers = self.prepare_workers
        deadline = 0.0
        t_start = time.perf_counter()
        on_restored = getattr(self.stages, "restored", None)     # optional: per-face share of the batch time
        needs_host = getattr(self.stages, "needs_host_restored", None) if self.on_device else None

        def complete() -> bool:
            nonlocal inflight
            if inflight is None:
                return True
            batch, entries = inflight
            inflight = None
            try:
                outs = batch.result()
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self._fail_entries(entries, exc)
                return True
            dev = batch.device_out if self.on_device else None
            share = (time.perf_counter() - batch.submitted_at) / len(entries)
            for i, (state, k) in enumerate(entries):
                if on_restored is not None:
                    on_restored(state.job, share)
                state.restored[k] = outs[i]
                if dev is not None:
                    if state.restored_device is None:
                        state.restored_device = [None] * len(state.crops)
                    state.restored_device[k] = dev[i]
                state.remaining -= 1
                if state.remaining == 0 and not state.failed:
                    if not self._to_finish(state):
                        return False
            return True

        def launch(n: int) -> bool:
            nonlocal inflight, pending
            live = [(s, k) for s, k in pending if not s.failed]
            entries, pending = live[:n], live[n:]
            if not entries:
                return True
            if self.before_restore is not None:
                self.before_restore()
            try:
                download = needs_host is None or any(needs_host(s.job) for s, _ in entries)
                batch = self.restorer.submit([s.crops[k] for s, k in entries], download=download)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                self._fail_entries(entries, exc)
                return True
            ok = complete()                     # the previous batch finishes while this one computes
            inflight = (batch, entries)
            return ok

        while not self.stop.is_set():
            limit = self.restorer.limit
            if len(pending) >= limit:
                if not launch(limit):
                    break
                deadline = time.perf_counter() + self.max_wait
                continue
            if producers == 0:
                if pending:
                    if not launch(self.take(len(pending), limit)):
                        break
                    continue
                complete()
                break
            if not pending:
                if inflight is not None and not complete():   # nothing to overlap with: hand results on
                    break
                t0 = time.perf_counter()
                item = self._get(self.ready_q)
                self._add_time("gpu_wait_input_s", time.perf_counter() - t0)
            else:
                item = self._get(self.ready_q, timeout=deadline - time.perf_counter())
                if item is None:
                    if self.stop.is_set():
                        break
                    if inflight is not None and not inflight[0].done():
                        # the device is still busy: a partial batch would only queue behind it, so keep filling
                        deadline = time.perf_counter() + _BUSY_POLL_S
                        continue
                    if not launch(self.take(len(pending), limit)):   # waited long enough: run what is there
                        break
                    deadline = time.perf_counter() + self.max_wait
                    continue
            if item is None:
                break
            if item is _DONE:
                producers -= 1
                continue
            if not item.crops:                    # no face: straight to paste/encode (copies the image)
                if not self._to_finish(item):
                    break
                continue
            if not pending:
                deadline = time.perf_counter() + self.max_wait
            pending.extend((item, k) for k in range(len(item.crops)))
        self.t["gpu_stage_s"] = time.perf_counter() - t_start
        for _ in range(self.workers):
            if not self._put(self.finish_q, None):
                break

    def _fail_entries(self, entries: list[tuple[_JobState, int]], exc: BaseException) -> None:
        for state, _ in entries:
            if not state.failed:
                state.failed = True
                self._fail(state.index, exc)

    def _to_finish(self, state: _JobState) -> bool:
        t0 = time.perf_counter()
        ok = self._put(self.finish_q, state)
        self._add_time("gpu_wait_output_s", time.perf_counter() - t0)
        return ok

    def _finish_worker(self) -> None:
        while True:
            # after a stop, finish what is already queued? no: drop it; only the file being written completes
            state = self._get(self.finish_q)
            if state is None:
                return
            t0 = time.perf_counter()
            try:
                out = self.stages.finish(state.job, state.restored, state.restored_device)
            except KeyboardInterrupt:
                self._post(ImageResult(state.index, state.path, "dropped", error="interrupted"))
                raise
            except Exception as exc:
                self._fail(state.index, exc)
                continue
            finally:
                self._add_time("finish_s", time.perf_counter() - t0)
            self._post(ImageResult(state.index, state.path, "ok", output=out, faces=len(state.crops), job=state.job))

    # -- driver -------------------------------------------------------------------------------------------------
    def execute(self, on_result: Callable[[ImageResult], None] | None) -> RunSummary:
        saved_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(saved_interval, SWITCH_INTERVAL_S))
        try:
            return self._execute(on_result)
        finally:
            sys.setswitchinterval(saved_interval)

    def _execute(self, on_result: Callable[[ImageResult], None] | None) -> RunSummary:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=self._guard(self._feeder), name="gpen-feed", daemon=True)]
        threads += [threading.Thread(target=self._guard(self._prepare_worker), name=f"gpen-prep{i}", daemon=True)
                    for i in range(self.prepare_workers)]
        threads.append(threading.Thread(target=self._guard(self._gpu_stage), name="gpen-gpu", daemon=True))
        threads += [threading.Thread(target=self._guard(self._finish_worker), name=f"gpen-fin{i}", daemon=True)
                    for i in range(self.workers)]
        for th in threads:
            th.start()
        results: dict[int, ImageResult] = {}
        try:
            while len(results) < len(self.paths):
                try:
                    r = self.result_q.get(timeout=_POLL_S)
                except queue.Empty:
                    if self.stop.is_set():
                        break
                    continue
                results[r.index] = r
                if on_result is not None:
                    on_result(r)
        except KeyboardInterrupt:
            self.interrupted.set()
        finally:
            if self.interrupted.is_set():
                self.stop.set()
            self._join(threads)
        while not self.result_q.empty():         # files completed while the threads wound down
            r = self.result_q.get()
            results.setdefault(r.index, r)
        ordered = [results.get(i) or ImageResult(i, p, "dropped", error="interrupted")
                   for i, p in enumerate(self.paths)]
        stages = dict(self.t)
        times = self.restorer.times
        stages.update(
            workers=self.workers, prepare_workers=self.prepare_workers, max_inflight=self.max_inflight,
            peak_inflight=self.inflight.peak,
            queue_peaks={"in": self.in_q.peak, "ready": self.ready_q.peak, "finish": self.finish_q.peak},
            queue_bounds={"in": self.in_q.maxsize, "ready": self.ready_q.maxsize, "finish": self.finish_q.maxsize},
            batch_limit=self.restorer.limit, batches=times.batches, faces=times.faces,
            batch_sizes=dict(sorted(times.batch_sizes.items())), oom_splits=times.oom_splits,
            generator_s=times.generator_s, upload_s=times.upload_s, download_wait_s=times.download_wait_s,
        )
        return RunSummary(ordered, time.perf_counter() - t0, self.interrupted.is_set(), stages)

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for every thread; a second Ctrl-C while finish workers complete their file is ignored once."""
        ignored = False
        for th in threads:
            while th.is_alive():
                try:
                    th.join(timeout=_POLL_S)
                except KeyboardInterrupt:
                    self.interrupted.set()
                    self.stop.set()
                    if ignored:
                        raise
                    ignored = True
