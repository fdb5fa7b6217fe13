"""Every GPU of one host: one `Pipeline` per device (its own restorer, CUDA graphs, detector), one shared queue.

    pool = DevicePool(settings, tune, devices=parse_devices("all"))      # or "0,1,3"; ["cpu", "cpu"] in tests
    gpen_tune.enhance(["albums/"], "out/", pipeline=pool)                # planning, photos, videos as always
    pool.device_summary()                                                # faces/s per device

`DevicePool` offers what `gpen_tune.pipeline.api.enhance` and `gpen_tune.pipeline.video.enhance_video` use of a
`Pipeline` (`run`, `prepare`, `close`, `device`, `restorer`), so input collection, output planning and the sinks
stay theirs. `run` gives each device its own `Pipeline.run` (in a thread, or in a worker process) fed from one
shared queue of inputs; each input is processed exactly as on one device, so the files and pixels are the same.

Threads or processes (`mode`). "process" (the default when the devices are GPUs): a worker process per GPU for
runs of photo files (`workers.py`). Each worker sees only its GPU, as cuda:0 (`CUDA_VISIBLE_DEVICES`), so it runs
exactly the one-GPU path that was measured: CUDA graph capture and the detector's serving thread use the current
device, which in one process would be GPU 0 for every thread that did not choose another. Each worker also has
its own GIL (the GIL limited the detector thread on one GPU already, and 8 schedulers in one process would share
one), and a crashed device takes only its worker down. "thread": one scheduler per device in this process, each
in a thread of its own (its threads make their device current); what arrays and videos use in both modes, since
their pixels stay in memory and an ordered sink or a tracker needs one process; and the default for CPU stand-in
devices. Neither choice could be timed on several GPUs here: `benchmarks/scaling.py` measures both.

Failures. An error that is the device's (a CUDA error, a lost device: `is_device_failure`) marks the device lost:
its restorer refuses further batches (`GuardedRestorer`), its lane takes no more inputs, and every input that failed
on it is queued again for the other devices; an input that fails on its own (a bad file) fails the same way on any
device and is reported once. A lane that fails otherwise (its thread raised, a thread of its scheduler failed; a
worker process that died, killed or crashed: `workers.py`) is lost the same way, with the reason in
`device_summary` (a worker's exit code and signal), and every input it had taken without a result goes to the
others; once no device is left, each input still queued fails with one line.

Videos (thread lanes; `shared_queue.py`). Frames are handed out as any inputs, decoded in order only as the
devices take them; each device detects faces in, restores and pastes the frames it took, the tracker (which needs
every frame's detections in order) is called in frame order across the devices (`OrderedTracker`), and the
encoder gets the frames in source order through the reorder buffer (`ReorderBuffer`, at most the devices'
in-flight frames held). Each frame is tracked once and its smoothed landmarks kept until it is written, so a
frame redone on another device after a loss is aligned, restored and pasted as the first time: the video is the
one a single device writes.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import cv2
import torch

from gpen_tune.distributed.lanes import (
    GuardedRestorer,
    build_lane_restorer,
    is_device_failure,
    on_device,
)
from gpen_tune.distributed.shared_queue import LaneSink, LaneSource, OrderedTracker, ReorderBuffer, SharedQueue
from gpen_tune.distributed.workers import WorkerSpec, run_processes
from gpen_tune.face.detect import default_notify
from gpen_tune.pipeline.api import Pipeline
from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.scheduler import RunSummary, SchedulerConfig, dropped
from gpen_tune.pipeline.settings import EnhanceSettings, resolve_weights
from gpen_tune.pipeline.sinks import FileSink, Sink
from gpen_tune.pipeline.sources import FileSource, Source, SourceItem
from gpen_tune.restore import Restorer
from gpen_tune.tune.options import TuneConfig

_POLL_S = 0.05


def parse_devices(spec: str | Sequence[str]) -> list[str]:
    """`all` | `0,1,3` | `cuda:0,cuda:2` | `cpu,cpu` (CPU stand-ins, for tests) -> torch device names."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if str(s).strip()]
    count = torch.cuda.device_count()
    if names == ["all"]:
        if count == 0:
            raise ValueError("--devices all: no CUDA GPU is visible to PyTorch (check the driver / "
                             "CUDA_VISIBLE_DEVICES)")
        return [f"cuda:{i}" for i in range(count)]
    devices = []
    for name in names:
        if name == "cpu":
            devices.append("cpu")
            continue
        index = name.removeprefix("cuda:")
        if not index.isdigit():
            raise ValueError(f"--devices {name}: expected 'all' or GPU numbers such as 0,1,3")
        if int(index) >= count:
            raise ValueError(f"--devices {name}: only {count} CUDA GPU(s) visible (numbers start at 0)")
        devices.append(f"cuda:{int(index)}")
    if not devices:
        raise ValueError("--devices: name at least one device ('all' or GPU numbers such as 0,1,3)")
    if len(set(d for d in devices if d != "cpu")) != len([d for d in devices if d != "cpu"]):
        raise ValueError(f"--devices {','.join(names)}: a GPU is named twice")
    return devices


@dataclass(eq=False)
class Lane:
    """One device: its pipeline and what it did."""

    name: str
    pipeline: Pipeline | None                        # None for a process lane until a thread run needs one
    guard: GuardedRestorer | None
    images: int = 0
    faces: int = 0
    busy_s: float = 0.0
    retried: int = 0                                 # inputs of this device queued again after it was lost
    lost_reason: str | None = None

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None or (self.guard is not None and self.guard.lost is not None)

    def lose(self, reason: str) -> None:
        if self.lost_reason is None:
            self.lost_reason = (self.guard.lost if self.guard is not None else None) or reason

    def summary(self) -> dict[str, Any]:
        return {"device": self.name, "images": self.images, "faces": self.faces, "busy_s": round(self.busy_s, 3),
                "faces_per_s": round(self.faces / self.busy_s, 3) if self.busy_s else None,
                "lost": self.lost_reason or (self.guard.lost if self.guard is not None else None),
                "retried_elsewhere": self.retried}


class DevicePool:
    """One `Pipeline` per device behind the part of the `Pipeline` interface that `enhance` uses.

    Args:
        settings, tune: as for `Pipeline` (`settings.device` is replaced by each device; on CUDA devices the
            detector runs in a process of its own unless `tune.lazy_detector`, see the module docstring).
        devices: torch device names (`parse_devices`); "cpu" may repeat (stand-in devices for tests).
        mode: "thread" (a lane per device in this process), "process" (a worker process per device for runs of
            photo files, `workers.py`; arrays and videos still take thread lanes) or "auto" (process when a
            device is a GPU, else thread). See the module docstring.
        restorers: thread mode: one built restorer per device instead of loading `settings.weights` (tests).
        restorer_factories: process mode: one picklable callable per device that builds its restorer in the
            worker (tests).
        notify: one-line notices (printed once, for the first device).
    """

    def __init__(self, settings: EnhanceSettings | None = None, tune: TuneConfig | None = None, *,
                 devices: Sequence[str], mode: str = "auto", restorers: Sequence[Restorer] | None = None,
                 restorer_factories: Sequence[Callable[[], Restorer] | None] | None = None,
                 notify: Callable[[str], None] = default_notify):
        self._save_mask = False
        self.settings = settings or EnhanceSettings()
        self.tune = tune or TuneConfig()
        self.notify = notify
        if not devices:
            raise ValueError("DevicePool needs at least one device")
        if mode not in ("auto", "thread", "process"):
            raise ValueError(f"mode must be 'auto', 'thread' or 'process', got {mode!r}")
        for given in (restorers, restorer_factories):
            if given is not None and len(given) != len(devices):
                raise ValueError(f"{len(devices)} devices but {len(given)} restorers")
        self.mode = mode if mode != "auto" else ("process" if any(d.startswith("cuda") for d in devices)
                                                 else "thread")
        self.devices = list(devices)
        self.restorer_factories = restorer_factories
        self.lanes = [Lane(device, None, None) for device in devices]
        if self.mode == "thread":
            for i, lane in enumerate(self.lanes):
                self._build_lane(lane, restorers[i] if restorers is not None else None)
        else:                                             # the workers load the weights: decide them once, here
            self.settings = replace(self.settings, weights=resolve_weights(self.settings, notify))

    def _lane_settings(self, device: str) -> EnhanceSettings:
        return replace(self.settings, device=device, detector_process=self.settings.detector_process
                       or (device.startswith("cuda") and not self.tune.lazy_detector))

    def _build_lane(self, lane: Lane, restorer: Restorer | None = None) -> None:
        """A thread lane's pipeline: its own restorer (built on its device) and detector."""
        quiet = self.notify if lane is self.lanes[0] else (lambda _msg: None)
        settings = self._lane_settings(lane.name)
        with on_device(lane.name):
            if restorer is None:
                restorer = build_lane_restorer(settings, self.tune, lane.name, quiet)
            lane.guard = GuardedRestorer(restorer, lane.name)
            lane.pipeline = Pipeline(settings, self.tune, restorer=lane.guard, notify=quiet)

    # -- what enhance / run_command read ----------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return torch.device(self.lanes[0].name)

    @property
    def restorer(self) -> Restorer | None:
        """The first device's restorer (for the report); None while the work runs in worker processes."""
        return None if self.lanes[0].guard is None else self.lanes[0].guard.inner

    @property
    def weights_source(self) -> Any:
        pipe = self.lanes[0].pipeline
        return pipe.weights_source if pipe is not None else self.settings.weights

    def prepare(self) -> str | None:
        """Build every thread lane's detector and parser now (a missing file fails before any image); worker
        processes build theirs when they start (a worker that cannot start is reported by `run`)."""
        names = []
        for lane in self.lanes:
            if lane.pipeline is not None:
                with on_device(lane.name):
                    names.append(lane.pipeline.prepare())
        return names[0] if names else (None if self.settings.aligned else self.settings.detector)

    def device_summary(self) -> list[dict[str, Any]]:
        return [lane.summary() for lane in self.lanes]

    def close(self) -> None:
        for lane in self.lanes:
            if lane.pipeline is not None:
                lane.pipeline.close()

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ------------------------------------------------------------------------------------------------
    def run(self, source: Source, sink: Sink, *, serial: bool = False, config: SchedulerConfig = SchedulerConfig(),
            on_result: Callable[[ImageJob], None] | None = None, on_faces: Callable[[int], None] | None = None,
            save_faces: bool = False, tracker: Any = None, save_mask: bool = False) -> RunSummary:
        """Every item of `source` into `sink` over the devices; results in source order, as `Pipeline.run`
        (`save_mask` is kept by thread lanes; worker processes do not write blend weights)."""
        self._save_mask = save_mask
        t0 = time.perf_counter()
        live = [lane for lane in self.lanes if not lane.lost]
        if not live:
            raise RuntimeError(f"every device of this pool was lost ({self._lost_line()})")
        if (self.mode == "process" and isinstance(source, FileSource) and isinstance(sink, FileSink)
                and tracker is None):
            return self._run_processes(live, list(source), sink, serial, config, on_result, on_faces, save_faces, t0)
        for lane in live:
            if lane.pipeline is None:                # a process pool's run of arrays or a video
                self._build_lane(lane)
        shared = SharedQueue(source)
        reorder = ReorderBuffer(sink, shared) if getattr(sink, "ordered", False) else None
        shared_tracker = OrderedTracker(tracker, shared) if tracker is not None else None
        if reorder is not None and not serial:
            # results held for the ordered sink stay within what the devices hold in flight (video: whole frames)
            shared.window = sum(config.resolved(torch.device(lane.name).type)[2] for lane in live)
        switch, cv_threads = sys.getswitchinterval(), cv2.getNumThreads()   # the lanes set and restore both
        try:
            while shared.has_work():
                live = [lane for lane in self.lanes if not lane.lost]
                if not live:
                    break
                self._round(live, shared, sink, reorder, shared_tracker, serial, config, on_result, on_faces,
                            save_faces)
        finally:
            sys.setswitchinterval(switch)
            cv2.setNumThreads(cv_threads)
        if shared.read_error is not None:
            raise shared.read_error
        if shared.stopped and hasattr(source, "__len__"):
            shared.drain()                           # never read: reported as not processed, as on one pipeline
        for index in sorted(shared.pending):         # every device lost, or interrupted
            item = shared.items[index]
            job = dropped(index, item)
            if not shared.stopped:
                job.fail(f"{item.name}: not processed: every device was lost ({self._lost_line()})")
            shared.settle(index, job)
            if reorder is not None:
                reorder.offer(index, None)
        results = [shared.results[i] for i in range(shared.read)]
        return RunSummary(results, time.perf_counter() - t0, shared.stopped,
                          {"mode": "devices", "devices": self.device_summary()})

    def _lost_line(self) -> str:
        return "; ".join(f"{lane.name}: {lane.summary()['lost']}" for lane in self.lanes)

    def _run_processes(self, live: list[Lane], items: list[SourceItem], sink: FileSink, serial: bool,
                       config: SchedulerConfig, on_result, on_faces, save_faces: bool, t0: float) -> RunSummary:
        """Photo files over one worker process per device (workers.py); results in source order."""
        factory = dict(zip(map(id, self.lanes), self.restorer_factories or [None] * len(self.lanes), strict=True))
        specs = [WorkerSpec(self._lane_settings(lane.name), self.tune, lane.name, sink.naming, save_faces,
                            sink.save_comparison, serial, config, factory[id(lane)]) for lane in live]
        done, never, interrupted = run_processes(live, specs, items, on_result, on_faces)
        for index in never:
            job = dropped(index, items[index])
            if not interrupted:
                job.fail(f"{items[index].name}: not processed: every device was lost ({self._lost_line()})")
            done[index] = job
        if all(str(lane.lost_reason).startswith("could not start") for lane in live):
            raise RuntimeError(f"no device could start: {self._lost_line()}")
        return RunSummary([done[i] for i in range(len(items))], time.perf_counter() - t0, interrupted,
                          {"mode": "devices", "devices": self.device_summary()})

    def _counting(self, lane: Lane, on_faces: Callable[[int], None] | None) -> Callable[[int], None]:
        def count(n: int) -> None:
            lane.faces += n
            if on_faces is not None:
                on_faces(n)
        return count

    def _round(self, lanes: list[Lane], shared: SharedQueue, sink: Sink, reorder: ReorderBuffer | None,
               tracker: OrderedTracker | None, serial: bool, config: SchedulerConfig, on_result, on_faces,
               save_faces: bool) -> None:
        """One thread per device until the queue is empty; a lost device's failed inputs go back in it."""
        def work(lane: Lane) -> None:
            lane_source = LaneSource(shared, lane)
            lane_sink = LaneSink(sink, lane_source, reorder, tracker)

            def settle(job: ImageJob) -> None:
                index = lane_source.taken[job.index]
                if job.status == "error" and not lane.lost and is_device_failure(job.error):
                    lane.lose(job.error)
                redo = tracker is not None and tracker.take_redo(index)
                if redo or (job.status in ("error", "dropped") and lane.lost and not shared.stopped):
                    lane.retried += not redo
                    lane_source.handed_on.add(index)
                    shared.give_back(index)          # another device takes it (the same input, the same way)
                    return
                job.index = index
                lane.images += 1
                if reorder is not None and job.status not in ("ok", "no_face"):
                    # an ordered sink gets a failed job too (a video writes that frame as it came in)
                    kept = None
                    if job.status == "error":
                        kept = copy.copy(job)
                        kept.meta = shared.items[index].meta     # the lane may have let go of its own
                    reorder.offer(index, kept)
                    job.release(meta=True)
                shared.settle(index, job)
                if tracker is not None:
                    tracker.forget(index)
                if on_result is not None:
                    on_result(job)

            t = time.perf_counter()
            device = torch.device(lane.name)
            if device.type == "cuda":
                torch.cuda.set_device(device)        # this thread's kernels (serial path, ordered writes) on its GPU
            try:
                summary = lane.pipeline.run(lane_source, lane_sink, serial=serial, config=config, on_result=settle,
                                            on_faces=self._counting(lane, on_faces), save_faces=save_faces,
                                            tracker=tracker, save_mask=self._save_mask)
                if summary.interrupted and not shared.stopped:
                    # Ctrl-C reaches the main thread, which stops the shared queue first; a lane's run that ends
                    # interrupted on its own had one of its threads fail (the scheduler printed the traceback)
                    lane.lose("lane failed: a thread of its pipeline stopped with an error (traceback above)")
                    shared.hand_on(lane, lane_source)
                elif summary.interrupted:
                    for local, job in enumerate(summary.results):     # taken but never started: dropped
                        index = lane_source.taken[local] if local < len(lane_source.taken) else None
                        if index is not None and index not in shared.results:
                            job.index = index
                            shared.settle(index, job)
            except KeyboardInterrupt:                # stop the others too
                shared.stopped = True
            except BaseException as e:               # a bug in this lane: the others take its inputs, as for a loss
                traceback.print_exc()
                lane.lose(f"lane failed: {type(e).__name__}: {' '.join(str(e).split())}")
                shared.hand_on(lane, lane_source)
            finally:
                lane.busy_s += time.perf_counter() - t

        threads = [threading.Thread(target=work, args=(lane,), name=f"gpen-dev-{lane.name}", daemon=True)
                   for lane in lanes]
        for th in threads:
            th.start()
        try:
            for th in threads:
                while th.is_alive():
                    th.join(timeout=_POLL_S)
        except KeyboardInterrupt:
            shared.stopped = True
            for th in threads:
                th.join()
