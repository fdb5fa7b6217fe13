"""Process lanes for `DevicePool(mode="process")`: one worker process per device for runs of photo files.

Each worker sees only its own GPU (`CUDA_VISIBLE_DEVICES`, so it runs exactly the one-GPU code path, as cuda:0)
and has its own GIL; it builds its `Pipeline`, runs the plain scheduler on the inputs the parent hands it, writes
the files itself (`FileSink`) and sends back one small record per input. The parent deals the inputs in turn and
keeps a few queued per worker (`WINDOW`), so it always knows what each worker holds: when a worker's device is
lost (its restorer's guard) or the process dies (a crash, a kill, the OOM killer), every input it held that has no
result is handed to the others.
Only files travel this way (a path in, a record out); arrays and videos run on thread lanes.

A dead worker is noticed, never waited for. Each worker answers on a pipe of its own whose writing end only it
holds, and the parent waits on every pipe and every process sentinel with a short timeout
(`multiprocessing.connection.wait`): a worker's death closes its pipe (a message cut off by the kill reads as the
end) and fires its sentinel. One `multiprocessing.Queue` shared by the workers could not do this: a worker killed
while its feeder thread held the queue's write lock blocks every other worker's results, and a message it left
half written blocks the parent's `get`, timeout or not (the parent holds a writing end too, so no end of file
comes). A worker killed while it encoded leaves the encoder's temp file; once every worker has stopped, the temp
files of the inputs a dead worker held are removed (`remove_partial_writes`).
"""

from __future__ import annotations

import glob
import heapq
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import numpy as np

from gpen_tune.face.detect import Detection
from gpen_tune.imageio import partial_pattern
from gpen_tune.pipeline.job import FaceCrop, ImageJob
from gpen_tune.pipeline.outputs import OutputNaming
from gpen_tune.pipeline.scheduler import SchedulerConfig
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.pipeline.sources import SourceItem
from gpen_tune.tune.options import TuneConfig

WINDOW = 16                  # inputs queued per worker and not finished yet
STOP_WAIT_S = 60.0           # end of a run: how long the workers may take to finish their last file and exit
EXIT_WAIT_S = 5.0            # a worker whose pipe closed: how long it may take to exit before it is killed
_POLL_S = 0.1
_CUT_OFF = (EOFError, OSError, pickle.UnpicklingError)    # a worker's pipe at its end, or a message cut off


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable."""

    settings: EnhanceSettings
    tune: TuneConfig
    device: str                                    # as named by the user: "cuda:3" | "cpu"
    naming: OutputNaming
    save_faces: bool
    save_comparison: bool
    serial: bool
    config: SchedulerConfig
    restorer_factory: Callable[[], Any] | None     # builds the restorer in the worker instead of the weights (tests)


def record(job: ImageJob) -> dict[str, Any]:
    """What the parent needs of a finished job (no pixels)."""
    return {"status": job.status, "error": job.error, "output": None if job.output is None else str(job.output),
            "size": job.size, "timings": dict(job.timings), "nonfinite": job.nonfinite_faces,
            "detections": [None if f.detection is None else f.detection.to_dict() for f in job.faces]}


def job_from_record(index: int, item: SourceItem, rec: dict[str, Any]) -> ImageJob:
    job = ImageJob(source=item.name, index=index, stem=item.stem)
    job.status, job.error, job.size, job.timings = rec["status"], rec["error"], rec["size"], rec["timings"]
    job.output = None if rec["output"] is None else Path(rec["output"])
    job.nonfinite_faces = rec["nonfinite"]
    blank = np.zeros((2, 3))
    job.faces = [FaceCrop(None, blank, blank, None if d is None else Detection(
        np.array(d["box"]), d["score"], np.array(d["landmarks"]))) for d in rec["detections"]]
    return job


def exit_line(exitcode: int | None) -> str:
    """How a worker process ended, for the device summary: `exit code -9, SIGKILL` (the OOM killer's signal)."""
    if exitcode is None:
        return "worker process stopped answering and was killed"
    if exitcode < 0:
        try:
            return f"worker process ended (exit code {exitcode}, {signal.Signals(-exitcode).name})"
        except ValueError:
            pass
    return f"worker process ended (exit code {exitcode})"


def remove_partial_writes(naming: OutputNaming, stem: str) -> list[Path]:
    """Remove the temp files that encodes of input `stem` left when their process died mid-write; the removed paths.

    The photo (named by `naming`) and its side files (`faces/<stem>_faceNN.<ext>`, `comparisons/<stem>.<ext>`) are
    written through `imageio`, whose temp files `imageio.partial_pattern` names. Only call this when no process
    writes these outputs any more: a live encoder's temp file has the same name."""
    name, folder = Path(stem).name, Path(stem).parent
    photo = glob.escape(naming.pattern.format(name=name, suffix=naming.suffix, ext="\0")).replace("\0", "*")
    places = [(naming.outdir / folder, partial_pattern(photo)),
              (naming.outdir / "faces" / folder, partial_pattern(f"{glob.escape(name)}_face*")),
              (naming.outdir / "comparisons" / folder, partial_pattern(f"{glob.escape(name)}.*"))]
    removed = []
    for where, pattern in places:
        for path in where.glob(pattern):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class _Channel:
    """A worker's end of its result pipe: one whole message at a time from any of the worker's threads."""

    def __init__(self, conn: Connection):
        self.conn, self.lock = conn, threading.Lock()

    def put(self, message: tuple) -> None:
        with self.lock:
            self.conn.send(message)


def _worker_main(spec: WorkerSpec, tasks: Any, answers: Connection) -> None:
    """A worker process: build the pipeline on its device, then run what arrives on `tasks` until None."""
    # One body: the pipeline, the task generator and the result callbacks share the guard, `taken` and the channel.
    device = spec.device
    if device.startswith("cuda"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":")[1] if ":" in device else "0"
        device = "cuda:0"                          # read at CUDA's start, which comes after this line
    # cycle and CUDA: lanes and the pipeline load torch and import this module's caller; imported here, after
    # CUDA_VISIBLE_DEVICES is set for this worker
    from gpen_tune.distributed.lanes import GuardedRestorer, build_lane_restorer, is_device_failure
    from gpen_tune.pipeline.api import Pipeline
    from gpen_tune.pipeline.sinks import FileSink

    results = _Channel(answers)
    parent = os.getppid()
    ctrl_c = threading.Event()                     # "interrupted" runs: Ctrl-C, or one of the run's threads failed

    def on_sigint(signum: int, frame: Any) -> None:
        ctrl_c.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)
    try:
        settings = replace(spec.settings, device=device)
        restorer = (spec.restorer_factory() if spec.restorer_factory is not None
                    else build_lane_restorer(settings, spec.tune, device, lambda _msg: None))
        guard = GuardedRestorer(restorer, spec.device)
        pipe = Pipeline(settings, spec.tune, restorer=guard, notify=lambda _msg: None)
        pipe.prepare()
    except Exception as e:                         # weights, detector: the parent reports it
        results.put(("failed", f"{type(e).__name__}: {' '.join(str(e).split())}"))
        return
    results.put(("ready", None))
    taken: list[int] = []

    def items() -> Iterator[SourceItem]:
        while guard.lost is None:
            try:
                task = tasks.get(timeout=_POLL_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return                         # the parent is gone: no one reads what this worker would do
                continue
            if task is None:
                return
            index, name, stem, path = task
            taken.append(index)
            yield SourceItem(name, stem, lambda p=path: p)

    def on_result(job: ImageJob) -> None:
        if job.status == "error" and is_device_failure(job.error):
            guard.mark_lost(job.error)             # e.g. the detector's CUDA error: the device is gone
        results.put(("job", taken[job.index], record(job), guard.lost))

    try:
        summary = pipe.run(_Items(items), FileSink(spec.naming, spec.save_faces, spec.save_comparison),
                           serial=spec.serial, config=spec.config, on_result=on_result,
                           on_faces=lambda n: results.put(("faces", n)), save_faces=spec.save_faces)
        end = guard.lost
        if summary.interrupted:
            end = "interrupted" if ctrl_c.is_set() else ("worker failed: a thread of its pipeline stopped with an "
                                                          "error (traceback above)")
        results.put(("done", end))
    except KeyboardInterrupt:
        results.put(("done", "interrupted"))
    except BaseException as e:                     # never leave the parent waiting for a worker that is gone
        results.put(("done", f"worker failed: {type(e).__name__}: {' '.join(str(e).split())}"))
        raise
    finally:
        pipe.close()


class _Items:
    ordered = False

    def __init__(self, make: Callable[[], Iterator[SourceItem]]):
        self.make = make

    def __iter__(self) -> Iterator[SourceItem]:
        return self.make()


@dataclass(eq=False)
class _Worker:
    lane: Any                                      # devices.Lane-like: name, images, faces, busy_s, retried, lose()
    process: Any
    tasks: Any                                     # inputs to this worker (a queue: the parent's put never blocks)
    answers: Connection                            # its records back (a pipe only it writes: its death ends it)
    naming: OutputNaming                           # where it writes (its temp files are removed if it dies)
    started: float
    held: set[int] = field(default_factory=set)    # dealt, no result yet: handed on when the worker is lost
    unreported: set[int] = field(default_factory=set)   # ever dealt, never reported by it: where it may have written
    finished: bool = False                         # takes no more inputs (lost, failed, done)
    reading: bool = True                           # its pipe is open (closed: read to its end)
    gone: bool = False                             # the process has ended and is reaped


class _ProcessRun:
    """One run over worker processes: the pending heap, what each worker holds, the results."""

    def __init__(self, lanes: list[Any], specs: list[WorkerSpec], items: list[SourceItem],
                 on_result: Callable[[ImageJob], None] | None, on_faces: Callable[[int], None] | None):
        self.items, self.on_result, self.on_faces = items, on_result, on_faces
        self.pending = list(range(len(items)))
        self.done: dict[int, ImageJob] = {}
        self.interrupted = False
        self.stopping = False                      # the workers were asked to end: an exit is no loss
        ctx = mp.get_context("spawn")              # CUDA cannot be forked
        self.workers: list[_Worker] = []
        for lane, spec in zip(lanes, specs, strict=True):
            answers, their_end = ctx.Pipe(duplex=False)
            tasks = ctx.Queue()
            proc = ctx.Process(target=_worker_main, args=(spec, tasks, their_end), name=f"gpen-{lane.name}",
                               daemon=True)
            proc.start()
            their_end.close()                      # the worker holds the only writing end: its death ends the pipe
            self.workers.append(_Worker(lane, proc, tasks, answers, spec.naming, time.perf_counter()))

    # -- dealing ----------------------------------------------------------------------------------------------
    def deal(self) -> None:
        """Top every worker's queue up to WINDOW, one input each in turn (a worker still starting gets its share
        too: its queue waits for it, and what it holds goes back if it cannot start)."""
        live = [w for w in self.workers if not w.finished]
        while self.pending:
            open_ = [w for w in live if len(w.held) < WINDOW]
            if not open_:
                return
            for w in open_:
                while self.pending and self.pending[0] in self.done:   # written by a lost worker after it was
                    heapq.heappop(self.pending)                         # given back
                if not self.pending:
                    return
                i = heapq.heappop(self.pending)
                w.held.add(i)
                w.unreported.add(i)
                w.tasks.put((i, self.items[i].name, self.items[i].stem, self.items[i].load()))

    def lose(self, w: _Worker, reason: str) -> None:
        """The worker takes no more inputs; what it held without a result goes back to the others."""
        if w.finished:
            return
        w.finished = True
        w.lane.lose(reason)
        w.lane.busy_s += time.perf_counter() - w.started
        for i in w.held - self.done.keys():
            heapq.heappush(self.pending, i)
            w.lane.retried += 1
        w.held.clear()

    # -- receiving --------------------------------------------------------------------------------------------
    def pump(self, timeout: float) -> None:
        """Handle whatever arrives within `timeout`: records, closed pipes, ended processes."""
        waiting: dict[Any, _Worker] = {}
        for w in self.workers:
            if w.reading:
                waiting[w.answers] = w
            if not w.gone:
                waiting[w.process.sentinel] = w
        if not waiting:
            time.sleep(timeout)
            return
        for handle in wait(list(waiting), timeout=timeout):
            w = waiting[handle]
            if handle is w.answers:
                if w.reading:                      # not closed by an earlier handle of this round
                    try:
                        self.receive(w, w.answers.recv())
                    except _CUT_OFF:
                        self.closed(w)
            elif not w.gone:                       # its sentinel: the process ended
                self.reap(w)
            if self.interrupted:
                return

    def closed(self, w: _Worker) -> None:
        """A worker's pipe ended. Before its "done" that is its death (the pipe closes as the process ends): lose it
        now, with its exit code; after it (a normal end), its sentinel reaps it."""
        w.answers.close()
        w.reading = False
        if not w.finished:
            w.process.join(timeout=EXIT_WAIT_S)
            if w.process.is_alive():               # its pipe closed, yet it runs: it can report nothing more
                self.lose(w, exit_line(None))
                w.process.kill()
                w.process.join()
            self.reap(w)

    def reap(self, w: _Worker) -> None:
        """A worker process that ended: read the records it finished, then lose it with its exit code (unless it
        ended as asked)."""
        while w.reading:
            try:
                if not w.answers.poll(0):
                    break
                self.receive(w, w.answers.recv())
            except _CUT_OFF:
                break
        w.answers.close()
        w.reading = False
        w.process.join()                           # its sentinel fired, or it was killed: no wait
        w.gone = True
        w.tasks.cancel_join_thread()               # nobody reads its queue now: exiting must not wait to flush it
        if self.stopping and w.process.exitcode == 0:
            self.finish(w)
        else:
            self.lose(w, exit_line(w.process.exitcode))

    def finish(self, w: _Worker) -> None:
        """The worker ended as asked, at the run's end."""
        if not w.finished:
            w.finished = True
            w.lane.busy_s += time.perf_counter() - w.started

    def receive(self, w: _Worker, message: tuple) -> None:
        kind, *rest = message
        if kind == "ready":
            w.started = time.perf_counter()
        elif kind == "failed":
            self.lose(w, f"could not start: {rest[0]}")
        elif kind == "faces":
            w.lane.faces += rest[0]
            if self.on_faces is not None:
                self.on_faces(rest[0])
        elif kind == "job":
            self.job(w, *rest)
        elif kind == "done":
            if rest[0] == "interrupted":
                self.interrupted = True
            elif rest[0] is None and self.stopping:
                self.finish(w)
            else:
                self.lose(w, rest[0] or "ended early")

    def job(self, w: _Worker, index: int, rec: dict[str, Any], lost: str | None) -> None:
        w.unreported.discard(index)
        failed_by_device = rec["status"] in ("error", "dropped") and lost is not None
        if index in self.done or (failed_by_device and w.finished):
            return                                 # given back already when the worker was lost
        w.held.discard(index)
        if failed_by_device:
            heapq.heappush(self.pending, index)
            w.lane.retried += 1
            self.lose(w, lost)
            return
        job = job_from_record(index, self.items[index], rec)
        self.done[index] = job
        w.lane.images += 1
        if self.on_result is not None:
            self.on_result(job)

    # -- the run ----------------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while len(self.done) < len(self.items) and not self.interrupted:
                if all(w.finished for w in self.workers):
                    break
                self.deal()
                self.pump(_POLL_S)
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.stop()

    def stop(self) -> None:
        """Ask every worker to end, read it to its end (bounded), kill what does not end, clean a dead one's files."""
        self.stopping = True
        for w in self.workers:
            if not w.gone:
                w.tasks.put(None)
        deadline = time.perf_counter() + STOP_WAIT_S
        try:
            while any(not w.gone for w in self.workers) and time.perf_counter() < deadline:
                self.pump(_POLL_S)
        except KeyboardInterrupt:
            self.interrupted = True
        for w in self.workers:
            if not w.gone:
                self.lose(w, f"worker process did not end within {STOP_WAIT_S:.0f} s of the run's end; killed")
                w.process.kill()
                self.reap(w)
            self.finish(w)
            w.tasks.close()
        for w in self.workers:                     # no process writes now: a dead worker's temp files can go
            if w.process.exitcode != 0:
                for i in w.unreported:
                    remove_partial_writes(w.naming, self.items[i].stem)


def run_processes(lanes: list[Any], specs: list[WorkerSpec], items: list[SourceItem],
                  on_result: Callable[[ImageJob], None] | None, on_faces: Callable[[int], None] | None
                  ) -> tuple[dict[int, ImageJob], list[int], bool]:
    """Every item over one worker process per lane; (results by index, indices never done, interrupted)."""
    run = _ProcessRun(lanes, specs, items, on_result, on_faces)
    run.run()
    never = sorted(set(range(len(items))) - run.done.keys())
    return run.done, never, run.interrupted
