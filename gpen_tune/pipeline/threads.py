"""The threaded scheduler: the three calls of `gpen_tune.pipeline.steps` on threads.

    feeder ──in_q──> prepare x N ──ready_q──> GPU stage ──finish_q──> finish x M ──result_q──> caller
     (source items)  (steps.prepare)           (steps.restore: faces of     (steps.finish)
                                                many images in bucket-sized
                                                batches, one in flight)

Why threads: cv2, numpy and torch release the GIL in their heavy calls, and one process keeps one copy of the
models (the detector may run in a process of its own: gpen_tune.face.detect's "process" service). Memory stays
flat whatever the source's length: an item holds an in-flight slot from the moment the feeder takes it until
its result is posted, there are at most `max_inflight` slots, and every queue is bounded. What is ordered (a
video's tracker, its encoder) the steps keep in order themselves.

The GIL hand-over interval is lowered while the threads run (CPython's default is 5 ms): the threads that
drive the GPU release the GIL at every host sync and cv2 call, and with 16+ Python threads each re-take waited
up to the default interval, which made a GPU detector call of ~4 images last ~200 ms in a folder run (H200,
benchmarks/results/20261130-194256) against ~12 ms per image alone.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import cv2
import torch

from gpen_tune.pipeline.job import ImageJob, one_line
from gpen_tune.pipeline.scheduler import RunSummary, SchedulerConfig, dropped, new_job
from gpen_tune.pipeline.sources import Source, SourceItem
from gpen_tune.pipeline.steps import FaceRef, RestoreBatch, Steps

_DONE = object()      # a prepare worker has no more input
_POLL_S = 0.05        # how often blocked threads look at the stop flag
_BUSY_POLL_S = 0.001  # how often a partial batch checks whether the device has become free
SWITCH_INTERVAL_S = 0.0002


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


def run_threaded(source: Source, steps: Steps, config: SchedulerConfig = SchedulerConfig(),
                 on_result: Callable[[ImageJob], None] | None = None,
                 on_faces: Callable[[int], None] | None = None) -> RunSummary:
    """Every item of `source` through the threads; results in source order (see the module docstring)."""
    restorer = steps.restorer
    run = _Run(source, steps, config, on_faces)
    threads = cv2.getNumThreads()
    if run.workers > 1:
        cv2.setNumThreads(1)     # the workers are the parallelism: no per-call OpenCV thread pools on top
    saved_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(saved_interval, SWITCH_INTERVAL_S))
    torch_threads = torch.get_num_threads()
    if restorer.device.type == "cpu":
        torch.set_num_threads(config.cpu_threads())   # generator and detector at once: split the cores
    try:
        return run.execute(on_result)
    finally:
        sys.setswitchinterval(saved_interval)
        cv2.setNumThreads(threads)
        torch.set_num_threads(torch_threads)


class _Run:
    def __init__(self, source: Source, steps: Steps, config: SchedulerConfig,
                 on_faces: Callable[[int], None] | None = None):
        self.source, self.steps, self.restorer = source, steps, steps.restorer
        self.on_faces = on_faces
        self.workers, self.prepare_workers, self.max_inflight = config.resolved(self.restorer.device.type)
        self.max_wait = config.max_wait_ms / 1000.0
        self.detect_batch = max(1, config.detect_batch)
        self.stop = threading.Event()
        self.interrupted = threading.Event()
        self.slots = threading.Semaphore(self.max_inflight)
        self.inflight = _Counter()
        self.items: dict[int, SourceItem] = {}    # taken by the feeder, result not posted yet
        self.total: int | None = None             # known once the feeder has exhausted the source
        self._rest: Any = None                    # the feeder's iterator (what it never took, after a stop)
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

    def _post(self, job: ImageJob) -> None:
        """Hand a finished job to the caller and free its in-flight slot."""
        self.result_q.put(job)
        self.inflight.add(-1)
        self.slots.release()

    def _fail(self, job: ImageJob, exc: BaseException) -> None:
        job.fail(one_line(job.source, exc))
        self._settle(job)

    def _settle(self, job: ImageJob) -> None:
        """A failed job: to the sink (an ordered one writes it as it came in) and the caller."""
        self.steps.finish(job)
        self._post(job)

    def _guard(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Thread body wrapper: an interrupt raised inside a stage stops the whole run cleanly."""

        device = self.restorer.device

        def body() -> None:
            if device.type == "cuda" and device.index is not None:
                torch.cuda.set_device(device)     # threads start on GPU 0; a pipeline on GPU N launches there
            try:
                fn()
            except KeyboardInterrupt:
                self.interrupted.set()
                self.stop.set()
            except BaseException:  # a bug in the scheduler itself: stop rather than hang
                traceback.print_exc()
                self.interrupted.set()
                self.stop.set()

        return body

    # -- threads ------------------------------------------------------------------------------------------------
    def _feeder(self) -> None:
        # a slot first, then an item: a lane of a device pool that cannot start an input leaves it to the others
        count = 0
        self._rest = iter(self.source)
        try:
            while True:
                if not self._take_slot():
                    return
                item = next(self._rest, None)
                if item is None:                     # the source is exhausted
                    self.slots.release()
                    break
                self.items[count] = item             # taken from the source: reported even if never run
                count += 1
                self.inflight.add(1)
                if not self._put(self.in_q, count - 1):
                    return
        finally:
            self.total = count
        for _ in range(self.prepare_workers):
            if not self._put(self.in_q, None):
                return

    def _take_slot(self) -> bool:
        """Wait for a free in-flight slot; False (holding none) once the run is stopping."""
        while not self.slots.acquire(timeout=_POLL_S):
            if self.stop.is_set():
                return False
        if self.stop.is_set():
            self.slots.release()
            return False
        return True

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
                if not self._prepare_group(group):
                    return
        finally:
            if not self.stop.is_set():
                self._put(self.ready_q, _DONE)

    def _prepare_group(self, group: list[int]) -> bool:
        """Prepare a group with one detector call and queue each job for the GPU stage (a failed one straight to
        the caller); False when stopping."""
        jobs = [new_job(i, self.items[i]) for i in group]
        t0 = time.perf_counter()
        try:
            self.steps.prepare(jobs)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            for job in jobs:
                self._fail(job, exc)
            return True
        finally:
            self._add_time("prepare_s", time.perf_counter() - t0)
        for job in jobs:
            if job.status == "error":
                self._settle(job)
            elif not self._put(self.ready_q, job):
                return False
        return True

    def _gpu_stage(self) -> None:
        # One loop owns the batch in flight and the pending faces; split, it would share that state across functions.
        pending: list[FaceRef] = []                  # faces waiting for a batch, arrival order
        inflight: RestoreBatch | None = None
        producers = self.prepare_workers
        deadline = 0.0
        t_start = time.perf_counter()

        def complete() -> bool:
            nonlocal inflight
            batch, inflight = inflight, None
            if batch is None:
                return True
            for job in batch.collect():
                if job.status == "error":
                    self._settle(job)
                elif not self._to_finish(job):
                    return False
            if self.on_faces is not None and batch.error is None:
                self.on_faces(len(batch))
            return True

        def launch(n: int) -> bool:
            nonlocal inflight, pending
            live = [(job, k) for job, k in pending if job.status != "error"]
            entries, pending = live[:n], live[n:]
            if not entries:
                return True
            batch = self.steps.restore(entries)
            ok = complete()                     # the previous batch finishes while this one computes
            inflight = batch
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
                    if not launch(self.restorer.take(len(pending))):
                        break
                    continue
                complete()
                break
            if not pending:
                if inflight is not None and not complete():   # nothing to overlap with: hand results on
                    break
                t0 = time.perf_counter()
                job = self._get(self.ready_q)
                self._add_time("gpu_wait_input_s", time.perf_counter() - t0)
            else:
                job = self._get(self.ready_q, timeout=deadline - time.perf_counter())
                if job is None:
                    if self.stop.is_set():
                        break
                    if inflight is not None and not inflight.done():
                        # the device is still busy: a partial batch would only queue behind it, so keep filling
                        deadline = time.perf_counter() + _BUSY_POLL_S
                        continue
                    if not launch(self.restorer.take(len(pending))):   # waited long enough: run what is there
                        break
                    deadline = time.perf_counter() + self.max_wait
                    continue
            if job is None:
                break
            if job is _DONE:
                producers -= 1
                continue
            faces = job.unrestored()
            if not faces:                         # no face: straight to paste/encode (copies the image)
                if not self._to_finish(job):
                    break
                continue
            if not pending:
                deadline = time.perf_counter() + self.max_wait
            pending.extend(faces)
        self.t["gpu_stage_s"] = time.perf_counter() - t_start
        for _ in range(self.workers):
            if not self._put(self.finish_q, None):
                break

    def _to_finish(self, job: ImageJob) -> bool:
        t0 = time.perf_counter()
        ok = self._put(self.finish_q, job)
        self._add_time("gpu_wait_output_s", time.perf_counter() - t0)
        return ok

    def _finish_worker(self) -> None:
        while True:
            # after a stop, what is queued is dropped; only the file being written completes
            job = self._get(self.finish_q)
            if job is None:
                return
            t0 = time.perf_counter()
            try:
                self.steps.finish(job)
            except KeyboardInterrupt:
                job.status = "dropped"
                self._post(job)
                raise
            finally:
                self._add_time("finish_s", time.perf_counter() - t0)
            self._post(job)

    # -- driver -------------------------------------------------------------------------------------------------
    def execute(self, on_result: Callable[[ImageJob], None] | None) -> RunSummary:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=self._guard(self._feeder), name="gpen-feed", daemon=True)]
        threads += [threading.Thread(target=self._guard(self._prepare_worker), name=f"gpen-prep{i}", daemon=True)
                    for i in range(self.prepare_workers)]
        threads.append(threading.Thread(target=self._guard(self._gpu_stage), name="gpen-gpu", daemon=True))
        threads += [threading.Thread(target=self._guard(self._finish_worker), name=f"gpen-fin{i}", daemon=True)
                    for i in range(self.workers)]
        for th in threads:
            th.start()
        results: dict[int, ImageJob] = {}
        try:
            while self.total is None or len(results) < self.total:
                try:
                    job = self.result_q.get(timeout=_POLL_S)
                except queue.Empty:
                    if self.stop.is_set():
                        break
                    continue
                results[job.index] = job
                self.items.pop(job.index, None)
                if on_result is not None:
                    on_result(job)
        except KeyboardInterrupt:
            self.interrupted.set()
        finally:
            if self.interrupted.is_set():
                self.stop.set()
            self._join(threads)
        while not self.result_q.empty():         # files completed while the threads wound down
            job = self.result_q.get()
            results.setdefault(job.index, job)
        total = self.total if self.total is not None else max(results, default=-1) + 1
        ordered = [results.get(i) or dropped(i, self.items[i]) for i in range(total)]
        if self.interrupted.is_set() and self._rest is not None and hasattr(self.source, "__len__"):
            ordered += [dropped(i, item) for i, item in enumerate(self._rest, start=total)]   # never taken
        return RunSummary(ordered, time.perf_counter() - t0, self.interrupted.is_set(), self._stats())

    def _stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = dict(self.t)
        times = self.restorer.times
        stats.update(
            mode="threaded", workers=self.workers, prepare_workers=self.prepare_workers,
            max_inflight=self.max_inflight, peak_inflight=self.inflight.peak,
            queue_peaks={"in": self.in_q.peak, "ready": self.ready_q.peak, "finish": self.finish_q.peak},
            queue_bounds={"in": self.in_q.maxsize, "ready": self.ready_q.maxsize, "finish": self.finish_q.maxsize},
            batch_limit=self.restorer.limit, batches=times.batches, faces=times.faces,
            batch_sizes=dict(sorted(times.batch_sizes.items())), oom_splits=times.oom_splits,
            generator_s=times.generator_s, upload_s=times.upload_s, download_wait_s=times.download_wait_s,
        )
        return stats

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
