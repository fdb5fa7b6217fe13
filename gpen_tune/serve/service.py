"""`Service`: what the HTTP routes call. It builds the pipeline in the background (the server answers /healthz at
once and /readyz once the models are loaded and warm), runs each upload through prepare -> the shared batcher ->
finish, and works the job spool with one thread whose faces share the same batches as the live requests.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import CancelledError
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from gpen_tune.imageio import ImageReadError
from gpen_tune.serve.batcher import FaceBatcher, QueueFull, Ticket
from gpen_tune.serve.limits import HttpRefusal, ServeLimits, check_header, image_header
from gpen_tune.serve.metrics import ServeMetrics
from gpen_tune.serve.request_child import RequestSpec
from gpen_tune.serve.request_processes import RequestProcesses
from gpen_tune.serve.spool import JobRecord, JobSpool
from gpen_tune.serve.steps import RequestError, RequestOptions, Steps

DISCONNECT_POLL_S = 0.1
JOB_QUEUE_RETRY_S = 0.5


@dataclass
class Restored:
    """One finished image: the encoded file and what the response headers tell."""

    data: bytes
    ext: str
    faces: int
    timings: dict[str, float]


class JobCancelled(Exception):
    pass


class Service:
    def __init__(self, build: Callable[[], Steps], limits: ServeLimits, spool_dir: Path,
                 notify: Callable[[str], None] = print):
        self.build, self.limits, self.notify = build, limits, notify
        self.spool = JobSpool(Path(spool_dir) / "jobs", limits.spool_quota_bytes, limits.job_expiry_s)
        self.work_dir = Path(spool_dir) / "requests"          # uploads of live requests, removed after each
        self.steps: Steps | None = None
        self.batcher: FaceBatcher | None = None
        self.metrics = ServeMetrics(self._queue_depth, self._gpu_memory, self._generator_workers)
        self.ready = threading.Event()
        self.failed: str | None = None
        self._jobs: queue.Queue[str | None] = queue.Queue()
        self._job_tickets: dict[str, Ticket] = {}
        self._cancelled: set[str] = set()
        self._job_thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._job_lock = threading.Lock()
        self._running: str | None = None                     # the job the job thread works on
        self._loader = threading.Thread(target=self._load, name="gpen-serve-load", daemon=True)
        self._threads: anyio.CapacityLimiter | None = None    # the request steps' threads (made in the loop)
        self.remote: RequestProcesses | None = None           # --request-processes: prepare and finish there

    # -- life --------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Called in the event loop (the app's lifespan)."""
        self._threads = anyio.CapacityLimiter(self.limits.request_threads)
        self._switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_interval, Steps.switch_interval()))
        shutil.rmtree(self.work_dir, ignore_errors=True)      # a killed server's uploads: nobody waits for them
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._loader.start()

    def _load(self) -> None:
        try:
            steps = self.build()
            if steps.device.type == "cpu":
                import torch  # heavy: torch, loaded by the build already

                torch.set_num_threads(steps.cpu_threads())    # detection and the generator run at once
            workers = steps.generator_calls(self.limits.generator_calls)
            if self.limits.request_processes:                 # they start while the generator warms up
                shared = steps.detector_spec(self.limits.request_processes) if self.limits.shared_detector else None
                self.remote = RequestProcesses(RequestSpec.of(steps, self.limits.request_threads, self.work_dir),
                                               self.limits.request_processes, detector=shared)
            steps.warm_up(detector=self.remote is None)
            if self.remote is not None:
                self.remote.wait_ready()
            self.steps = steps
            self.batcher = FaceBatcher(steps, self.limits.max_wait_ms / 1000.0, self.limits.max_queue_faces,
                                       on_batch=self.metrics.on_batch, workers=workers)
            self.spool.expire()
            for record in self.spool.recover():
                self._jobs.put(record.id)
            self._job_thread = threading.Thread(target=self._job_loop, name="gpen-serve-jobs", daemon=True)
            self._job_thread.start()
            self.ready.set()
        except Exception as exc:                               # /readyz says why; /healthz stays up
            self.failed = " ".join(str(exc).split()) or type(exc).__name__
            self.notify(f"the models could not be loaded: {self.failed}")

    def close(self) -> None:
        """After the server stopped taking requests: an image job in progress completes, a video job stops (nothing
        written), queued and stopped jobs stay in the spool (the next server runs them), the batcher restores what
        is queued, the models are released."""
        self._stopping.set()
        if self._job_thread is not None:
            self._jobs.put(None)
            self._job_thread.join()
        if self.batcher is not None:
            self.batcher.close()
        if self.remote is not None:
            self.remote.close()
        if self.steps is not None:
            self.steps.close()
        sys.setswitchinterval(self._switch_interval)

    def check_ready(self) -> None:
        if self.failed is not None:
            raise HttpRefusal(503, f"the models could not be loaded: {self.failed}")
        if not self.ready.is_set():
            raise HttpRefusal(503, "the models are still loading", {"Retry-After": "5"})
        if self.remote is not None and (why := self.remote.exited()) is not None:
            raise HttpRefusal(503, why)

    # -- one image, live ----------------------------------------------------------------------------------------
    async def restore(self, data: bytes, name: str, ext: str, options: RequestOptions,
                      disconnected: Callable[[], Awaitable[bool]]) -> Restored:
        """The upload through prepare -> batcher -> finish within the request timeout; a client that goes away
        has its queued faces dropped. With request processes, prepare and finish run there."""
        self.check_ready()
        deadline = time.monotonic() + self.limits.request_timeout_s
        if self.remote is not None:
            return await self._restore_there(data, name, ext, options, disconnected, deadline)
        # the request's files are written, read and removed in worker threads: never on the event loop
        folder = Path(await self.in_thread(tempfile.mkdtemp, dir=self.work_dir))
        try:
            path = folder / f"input.{ext}"
            prepared = await _within(self.in_thread(self._write_and_prepare, path, data, name, options), deadline)
            await self._wait(self._submit(prepared), deadline, disconnected)
            body, out_ext = await self.in_thread(self._finish, prepared, folder, options.ext)
            return Restored(body, out_ext, prepared.faces, dict(prepared.timings))
        finally:
            await asyncio.shield(self.in_thread(shutil.rmtree, folder, True))

    async def _restore_there(self, data: bytes, name: str, ext: str, options: RequestOptions,
                             disconnected: Callable[[], Awaitable[bool]], deadline: float) -> Restored:
        """prepare and finish in a request process (the upload goes there and the image comes back through its
        pipe), the faces restored here in the shared batches."""
        asked = await self.in_thread(self.remote.prepare, data, name, ext, options)
        try:
            handed = await _within(asyncio.wrap_future(asked), deadline)
        except (RequestError, ImageReadError) as e:
            raise _refusal(e, None, name) from None
        try:
            await self._wait(self._submit(handed), deadline, disconnected)
            finished = await self.in_thread(self.remote.finish, handed, options.ext)
            body, out_ext, timings = await _within(asyncio.wrap_future(finished), deadline)
            return Restored(body, out_ext, handed.faces, {**handed.timings, **timings})   # + the restore here
        finally:
            self.remote.release(handed)

    def _submit(self, prepared: Any) -> Ticket:
        try:
            return self.batcher.submit(prepared)
        except QueueFull as e:
            raise HttpRefusal(503, f"busy: {e}", {"Retry-After": "1"}) from None

    async def in_thread(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`func` on one of the request threads (`--request-threads`; a request holds one while it waits for the
        shared detector, so the count bounds how many requests detect at once)."""
        return await anyio.to_thread.run_sync(functools.partial(func, *args, **kwargs), limiter=self._threads)

    def _finish(self, prepared: Any, folder: Path, ext: str | None) -> tuple[bytes, str]:
        path = self.steps.finish(prepared, folder / "out", ext)
        return path.read_bytes(), path.suffix.lstrip(".")

    def _write_and_prepare(self, path: Path, data: bytes, name: str, options: RequestOptions):
        path.write_bytes(data)
        return self._prepare(path, name, options)

    def _prepare(self, path: Path, name: str, options: RequestOptions):
        try:
            return self.steps.prepare(path, name, options)
        except (RequestError, ImageReadError) as e:
            raise _refusal(e, path, name) from None

    async def _wait(self, ticket: Ticket, deadline: float, disconnected: Callable[[], Awaitable[bool]]) -> None:
        waiter = asyncio.wrap_future(ticket.future)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HttpRefusal(504, f"not done within the request timeout ({self.limits.request_timeout_s:g} s)")
                done, _ = await asyncio.wait({waiter}, timeout=min(DISCONNECT_POLL_S, left))
                if done:
                    waiter.result()
                    return
                if await disconnected():
                    raise HttpRefusal(499, "the client went away")
        except BaseException:
            self._drop(ticket)
            raise

    def _drop(self, ticket: Ticket) -> None:
        before = self.batcher.stats.dropped
        self.batcher.cancel(ticket)
        self.metrics.dropped.inc(self.batcher.stats.dropped - before)

    # -- jobs --------------------------------------------------------------------------------------------------
    def job_kind(self, data: bytes, name: str) -> tuple[str, str]:
        """("image" | "video", the extension to store it under): an image from its header alone, else a video
        from its container (probed in a file: 415 when it is neither, 413 for frames above the pixel limit)."""
        if image_header(data, name) is not None:               # an image, or a refused image format (GIF)
            return "image", check_header(data, name, self.limits.max_pixels)
        self.check_ready()
        with tempfile.NamedTemporaryFile(dir=self.work_dir) as f:
            f.write(data)
            f.flush()
            try:
                ext, width, height = self.steps.video_info(Path(f.name), name)
            except RequestError:
                raise HttpRefusal(415, f"{name}: neither an image nor a video this server reads (images: JPEG, "
                                  "PNG, WebP, BMP, TIFF; videos: what FFmpeg decodes)") from None
        if width * height > self.limits.max_pixels:
            raise HttpRefusal(413, f"{name}: frames of {width}x{height} are above this server's limit of "
                              f"{self.limits.max_pixels / 1e6:.1f} megapixels")
        return "video", ext

    def submit_job(self, data: bytes, name: str, kind: str, ext: str, options: RequestOptions) -> JobRecord:
        self.check_ready()
        record = self.spool.create(data, name, ext, asdict(options), kind)
        self._jobs.put(record.id)
        return record

    def cancel_job(self, job_id: str) -> JobRecord | None:
        """Cancel a queued or running job and remove its files (a running job's once its run has stopped: its
        writer still holds them); None when there is no such job."""
        record = self.spool.get(job_id)
        if record is None:
            return None
        with self._job_lock:
            self._cancelled.add(job_id)
            running = self._running == job_id
        ticket = self._job_tickets.get(job_id)
        if ticket is not None:
            self._drop(ticket)
        if record.state not in ("done", "failed"):
            record.state = "cancelled"
        if not running:
            self.spool.delete(job_id)
        return record

    def _job_loop(self) -> None:
        while True:
            job_id = self._jobs.get()
            if job_id is None or self._stopping.is_set():      # the rest stays queued in the spool
                return
            record = self.spool.get(job_id)
            with self._job_lock:
                if record is None or record.state != "queued" or job_id in self._cancelled:
                    continue
                self._running = job_id
            try:
                self._work_on(record)
            finally:
                with self._job_lock:
                    self._running = None
                    cancelled = job_id in self._cancelled
                self._job_tickets.pop(job_id, None)
            if cancelled:
                self.spool.delete(job_id)

    def _work_on(self, record: JobRecord) -> None:
        """Run one job and record how it ended (a cancelled one is not recorded: its folder goes)."""
        record.state = "running"
        self.spool.save(record)
        try:
            path, record.faces = self._run_job(record)
            record.state, record.result, record.progress = "done", path.name, 1.0
        except (JobCancelled, CancelledError):
            return
        except HttpRefusal as e:
            record.state, record.error = "failed", e.message
        except Exception as e:
            if record.id in self._cancelled:
                return
            traceback.print_exc()
            record.state, record.error = "failed", " ".join(str(e).split()) or type(e).__name__
        if record.id not in self._cancelled:
            self.spool.save(record)

    def _run_job(self, record: JobRecord) -> tuple[Path, int]:
        options = RequestOptions(**record.options)
        if record.kind == "video":
            return self._run_video(record, options)
        prepared = self._prepare(self.spool.input_path(record), record.input_name, options)
        record.progress = 0.5                                 # decoded, faces found: restoring
        self.spool.save(record)
        while True:                                           # long work waits for room instead of failing
            if record.id in self._cancelled or self._stopping.is_set():
                raise JobCancelled
            try:
                ticket = self.batcher.submit(prepared)
                break
            except QueueFull:
                time.sleep(JOB_QUEUE_RETRY_S)
        self._job_tickets[record.id] = ticket
        ticket.future.result()
        if record.id in self._cancelled:
            raise JobCancelled
        return self.steps.finish(prepared, self.spool.folder(record.id), options.ext), prepared.faces

    def _run_video(self, record: JobRecord, options: RequestOptions) -> tuple[Path, int]:
        last = [0.0]

        def progress(share: float) -> None:
            if record.id in self._cancelled or self._stopping.is_set():
                raise KeyboardInterrupt              # the video run's own stop: nothing is written
            record.progress = round(share, 3)
            if share - last[0] >= 0.05:              # job.json rewritten every 5 %
                last[0] = share
                self.spool.save(record)

        path, faces = self.steps.enhance_video(self.spool.input_path(record), self.spool.folder(record.id),
                                               options, progress)
        if path is None:
            raise JobCancelled
        return path, faces

    # -- metrics -----------------------------------------------------------------------------------------------
    def _queue_depth(self) -> int:
        return 0 if self.batcher is None else self.batcher.stats.queued

    def _generator_workers(self) -> int:
        return 0 if self.batcher is None else self.batcher.workers

    def _gpu_memory(self) -> int:
        if self.steps is None or self.steps.device.type != "cuda":
            return 0
        import torch  # heavy: torch, loaded by the build already

        return int(torch.cuda.memory_allocated(self.steps.device))

    def counters(self) -> dict[str, Any]:
        stats = self.batcher.stats if self.batcher is not None else None
        return {"generator_calls": stats.calls if stats else 0, "faces": stats.faces if stats else 0,
                "faces_dropped": stats.dropped if stats else 0, "queued_faces": stats.queued if stats else 0,
                "request_processes": 0 if self.remote is None else len(self.remote.processes)}


def _refusal(error: Exception, path: Path | None, name: str) -> HttpRefusal:
    """A request's file that cannot be used: 400, named as the client named it (not by its `path` here)."""
    text = " ".join(str(error).split())
    return HttpRefusal(400, text if path is None or isinstance(error, RequestError) else text.replace(str(path), name))


async def _within(awaitable: Awaitable[Any], deadline: float) -> Any:
    try:
        return await asyncio.wait_for(awaitable, max(0.001, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise HttpRefusal(504, "not done within the request timeout") from None

