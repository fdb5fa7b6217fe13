"""Process lanes for `DevicePool(mode="process")`: one worker process per device for runs of photo files.

Each worker sees only its own GPU (`CUDA_VISIBLE_DEVICES`, so it runs exactly the one-GPU code path, as cuda:0)
and has its own GIL; it builds its `Pipeline`, runs the plain scheduler on the inputs the parent hands it, writes
the files itself (`FileSink`) and sends back one small record per input. The parent deals the inputs in turn and
keeps a few queued per worker (`WINDOW`), so it always knows what each worker holds: when a worker's device is
lost (its restorer's guard) or the process dies (a crash, a kill), every input it held that has no result is handed
to the others.
Only files travel this way (a path in, a record out); arrays and videos run on thread lanes.
"""

from __future__ import annotations

import heapq
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpen_tune.face.detect import Detection
from gpen_tune.pipeline.job import FaceCrop, ImageJob
from gpen_tune.pipeline.outputs import OutputNaming
from gpen_tune.pipeline.scheduler import SchedulerConfig
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.pipeline.sources import SourceItem
from gpen_tune.tune.options import TuneConfig

WINDOW = 16                  # inputs queued per worker and not finished yet
_POLL_S = 0.1


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


def _worker_main(spec: WorkerSpec, tasks: Any, results: Any, wid: int) -> None:
    """A worker process: build the pipeline on its device, then run what arrives on `tasks` until None."""
    device = spec.device
    if device.startswith("cuda"):
        os.environ["CUDA_VISIBLE_DEVICES"] = device.split(":")[1] if ":" in device else "0"
        device = "cuda:0"                          # read at CUDA's start, which comes after this line
    # cycle and CUDA: lanes and the pipeline load torch and import this module's caller; imported here, after
    # CUDA_VISIBLE_DEVICES is set for this worker
    from gpen_tune.distributed.lanes import GuardedRestorer, build_lane_restorer, is_device_failure
    from gpen_tune.pipeline.api import Pipeline
    from gpen_tune.pipeline.sinks import FileSink

    try:
        settings = replace(spec.settings, device=device)
        restorer = (spec.restorer_factory() if spec.restorer_factory is not None
                    else build_lane_restorer(settings, spec.tune, device, lambda _msg: None))
        guard = GuardedRestorer(restorer, spec.device)
        pipe = Pipeline(settings, spec.tune, restorer=guard, notify=lambda _msg: None)
        pipe.prepare()
    except Exception as e:                         # weights, detector: the parent reports it
        results.put(("failed", wid, f"{type(e).__name__}: {' '.join(str(e).split())}"))
        return
    results.put(("ready", wid, None))
    taken: list[int] = []

    def items() -> Iterator[SourceItem]:
        while guard.lost is None:
            task = tasks.get()
            if task is None:
                return
            index, name, stem, path = task
            taken.append(index)
            yield SourceItem(name, stem, lambda p=path: p)

    def on_result(job: ImageJob) -> None:
        if job.status == "error" and is_device_failure(job.error):
            guard.mark_lost(job.error)             # e.g. the detector's CUDA error: the device is gone
        results.put(("job", wid, taken[job.index], record(job), guard.lost))

    try:
        summary = pipe.run(_Items(items), FileSink(spec.naming, spec.save_faces, spec.save_comparison),
                           serial=spec.serial, config=spec.config, on_result=on_result,
                           on_faces=lambda n: results.put(("faces", wid, n)), save_faces=spec.save_faces)
        results.put(("done", wid, guard.lost or ("interrupted" if summary.interrupted else None)))
    except KeyboardInterrupt:
        results.put(("done", wid, "interrupted"))
    except BaseException as e:                     # never leave the parent waiting for a worker that is gone
        results.put(("done", wid, f"worker failed: {type(e).__name__}: {' '.join(str(e).split())}"))
        raise
    finally:
        pipe.close()


class _Items:
    ordered = False

    def __init__(self, make: Callable[[], Iterator[SourceItem]]):
        self.make = make

    def __iter__(self) -> Iterator[SourceItem]:
        return self.make()


@dataclass
class _Worker:
    lane: Any                                      # devices.Lane-like: name, images, faces, busy_s, retried, lose()
    process: Any
    tasks: Any
    held: set[int]
    ready: bool = False
    finished: bool = False
    started: float = 0.0


def run_processes(lanes: list[Any], specs: list[WorkerSpec], items: list[SourceItem],
                  on_result: Callable[[ImageJob], None] | None, on_faces: Callable[[int], None] | None
                  ) -> tuple[dict[int, ImageJob], list[int], bool]:
    """Every item over one worker process per lane; (results by index, indices never done, interrupted)."""
    # One loop owns the workers, the pending heap and the done map; split, the helpers would share that state.
    ctx = mp.get_context("spawn")                  # CUDA cannot be forked
    results = ctx.Queue()
    workers = []
    for wid, (lane, spec) in enumerate(zip(lanes, specs, strict=True)):
        tasks = ctx.Queue()
        proc = ctx.Process(target=_worker_main, args=(spec, tasks, results, wid), name=f"gpen-{lane.name}",
                           daemon=True)
        proc.start()
        workers.append(_Worker(lane, proc, tasks, set(), started=time.perf_counter()))
    pending = list(range(len(items)))
    done: dict[int, ImageJob] = {}
    interrupted = False

    def give_back(w: _Worker, indices: set[int]) -> None:
        for i in indices - done.keys():
            heapq.heappush(pending, i)
            w.lane.retried += 1
        w.held.clear()

    def deal(live: list[_Worker]) -> None:
        """Top every worker's queue up to WINDOW, one input each in turn (a worker still starting gets its share
        too: its queue waits for it, and what it holds goes back if it cannot start)."""
        while pending:
            open_ = [w for w in live if len(w.held) < WINDOW]
            if not open_:
                return
            for w in open_:
                while pending and pending[0] in done:      # written by a lost worker after it was given back
                    heapq.heappop(pending)
                if not pending:
                    return
                i = heapq.heappop(pending)
                w.held.add(i)
                w.tasks.put((i, items[i].name, items[i].stem, items[i].load()))

    def lose(w: _Worker, reason: str) -> None:
        if not w.finished:
            w.finished = True
            w.lane.lose(reason)
            w.lane.busy_s += time.perf_counter() - w.started
            give_back(w, set(w.held))

    try:
        while len(done) < len(items):
            live = [w for w in workers if not w.finished]
            if not live:
                break
            deal(live)
            try:
                kind, wid, *rest = results.get(timeout=_POLL_S)
            except queue.Empty:
                for w in live:
                    if not w.process.is_alive():
                        lose(w, f"worker process ended (exit code {w.process.exitcode})")
                continue
            w = workers[wid]
            if kind == "ready":
                w.ready, w.started = True, time.perf_counter()
            elif kind == "failed":
                lose(w, f"could not start: {rest[0]}")
            elif kind == "faces":
                w.lane.faces += rest[0]
                if on_faces is not None:
                    on_faces(rest[0])
            elif kind == "job":
                index, rec, lost = rest
                failed_by_device = rec["status"] in ("error", "dropped") and lost is not None
                if index in done or (failed_by_device and w.finished):
                    continue                       # given back already when the worker was lost
                w.held.discard(index)
                if failed_by_device:
                    heapq.heappush(pending, index)
                    w.lane.retried += 1
                    lose(w, lost)
                    continue
                job = job_from_record(index, items[index], rec)
                done[index] = job
                w.lane.images += 1
                if on_result is not None:
                    on_result(job)
            elif kind == "done":
                if rest[0] == "interrupted":
                    interrupted = True
                    break
                lose(w, rest[0] or "ended early")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        for w in workers:
            if w.process.is_alive():
                w.tasks.put(None)
        for w in workers:
            w.process.join(timeout=60)
            if w.process.is_alive():
                w.process.kill()
            if not w.finished:
                w.finished = True
                w.lane.busy_s += time.perf_counter() - w.started
    never = sorted(set(range(len(items))) - done.keys())
    return done, never, interrupted
