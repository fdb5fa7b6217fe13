"""The service's three calls into the face pipeline, and the only module of `gpen_tune.serve` that touches it:

    prepare(path, options)  decode, detect, align and cut one uploaded image (a `Prepared`: its faces to restore)
    restore(faces)          one generator call (and its parse masks) for faces of any number of requests
    finish(prepared, dir)   paste the restored faces back and encode the image into `dir`

plus `enhance_video` for video jobs: the pipeline's own video run, on the same generator (`SharedRestorer`).

Everything here calls the pipeline's own homes (`pipeline.steps`, the `Restorer`, `FileSink`), so a response carries the
pixels and the file format `gpen-tune enhance` writes for the same file; the batcher and the HTTP layer see only
these calls.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpen_tune.face.detect.process import DetectorSpec
from gpen_tune.imageio import ImageReadError
from gpen_tune.pipeline.api import Pipeline
from gpen_tune.pipeline.job import ImageJob
from gpen_tune.pipeline.outputs import VIDEO_OUTPUTS, OutputNaming
from gpen_tune.pipeline.scheduler import SchedulerConfig
from gpen_tune.pipeline.settings import EnhanceSettings
from gpen_tune.pipeline.sinks import FileSink
from gpen_tune.pipeline.steps import Steps as PipelineSteps
from gpen_tune.pipeline.threads import SWITCH_INTERVAL_S
from gpen_tune.restore.buckets import sizes_up_to
from gpen_tune.tune.hardware import usable_cores

VIDEO_EXTS = VIDEO_OUTPUTS              # what a video job may be written as
STAGES_KEPT = 16         # option combinations whose PipelineSteps are kept (strength is a float: bound the cache)


class RequestError(ValueError):
    """What a request asked for cannot be done here (one line; the HTTP layer answers 400)."""


@dataclass(frozen=True)
class RequestOptions:
    """The per-request choices users know from `gpen-tune enhance`."""

    strength: float = 1.0
    only_center_face: bool = False
    parse_mask: bool | None = None       # None: the server's setting
    ext: str | None = None               # output format; None: the input's


@dataclass
class Prepared:
    """One image after decode, detect and align: its job, the crops to restore and the stages that finish it."""

    job: ImageJob
    stages: PipelineSteps
    crops: list[Any]
    restored: list[np.ndarray | None] = field(default_factory=list)
    restored_device: list[Any] = field(default_factory=list)       # the GPU rows, for an image pasted there

    @property
    def faces(self) -> int:
        return len(self.job.faces)

    @property
    def timings(self) -> dict[str, float]:
        return self.job.timings

    @property
    def on_device(self) -> bool:
        """Pasted on the GPU: its restored rows stay there."""
        return self.job.on_device

    def add_time(self, step: str, seconds: float) -> None:
        self.job.add_time(step, seconds)


FaceRef = tuple[Prepared, int]           # one face of one request: (its image, the face's index)


class SharedRestorer:
    """The one restorer for the batcher's workers and a video job's scheduler at once. On a GPU each batch is
    submitted and collected under a lock, so no caller has a batch pending (in the restorer's staging buffers)
    while another submits. On the CPU the restorer runs each batch inline in the caller's thread with nothing
    shared between calls but the weights, so calls overlap (`Steps.generator_calls`). Everything else is the
    restorer's."""

    def __init__(self, restorer: Any):
        self._restorer = restorer
        cpu = restorer.device.type == "cpu"
        self._lock: Any = contextlib.nullcontext() if cpu else threading.Lock()

    def submit(self, crops: Sequence[Any], download: bool = True) -> Any:
        with self._lock:
            batch = self._restorer.submit(crops, download=download)
            batch.result()
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._restorer, name)


class Steps:
    """prepare / restore / finish over a built `Pipeline` (one generator, one detector service, one parser).

    `prepare` and `finish` may run on many threads at once; `restore` is called by one thread (the batcher)."""

    def __init__(self, pipeline: Pipeline):
        self.pipeline = pipeline
        self.restorer = SharedRestorer(pipeline.restorer)
        self._stages: dict[tuple, PipelineSteps] = {}
        self._lock = threading.Lock()

    @classmethod
    def build(cls, settings: EnhanceSettings, tune: Any, notify: Callable[[str], None], model: Any = None) -> Steps:
        """Load the generator, detector and parser now (a missing file fails here, before the server listens)."""
        pipe = Pipeline(settings, tune, model=model, cut_on_device=False, notify=notify)
        pipe.prepare()
        return cls(pipe)

    # -- what the batcher needs to know ---------------------------------------------------------------------------
    @property
    def limit(self) -> int:
        """The most faces one generator call takes."""
        return self.pipeline.restorer.limit

    def take(self, pending: int) -> int:
        """How many of `pending` faces the next generator call takes (the restorer's bucket policy)."""
        return self.pipeline.restorer.take(pending)

    @property
    def device(self) -> Any:
        return self.pipeline.device

    @staticmethod
    def switch_interval() -> float:
        """The GIL hand-over interval while the service's threads run: the threaded scheduler's (with CPython's
        5 ms a thread that left the GIL for a torch or cv2 call can wait that long to take it back)."""
        return SWITCH_INTERVAL_S

    def cpu_threads(self) -> int:
        """torch's threads on the CPU while detection and the generator run at once (as the threaded runs)."""
        return SchedulerConfig().cpu_threads()

    def generator_calls(self, asked: int | None = None) -> int:
        """How many generator calls run at once (the batcher's workers); `asked` None: the default.

        On the CPU as many as the cores hold at `cpu_threads` each (2 on 2 cores): a request's generator call is
        ~3x its detection there (GPEN-BFR-256 fp32, one torch thread each: ~240 vs ~85 ms), so with one call at a
        time concurrent requests queue at the generator while detection leaves the other core mostly idle; a
        second call fills it (4 clients on 2 cores: 1.27x and 0.96x one at a time with one call, 1.76x and 1.76x
        with two, runs interleaved; benchmarks/RESULTS.md, "Service"). A lone request still runs one call on one
        share. On a GPU one: the restorer stages one batch at a time on one stream (larger batches are the GPU's
        concurrency)."""
        if self.device.type != "cpu":
            if asked is not None and asked > 1:
                raise ValueError(f"--generator-calls {asked}: more than one generator call at once runs only on the "
                                 f"CPU, not on {self.device} (there raise --batch-size instead)")
            return 1
        if asked is not None:
            if asked < 1:
                raise ValueError(f"--generator-calls {asked}: give at least 1")
            return asked
        return max(1, usable_cores() // self.cpu_threads())

    def warm_up(self, detector: bool = True) -> None:
        """A detection and generator calls on grey pixels, so the first requests do not pay for lazy initialisation.

        A forward that pads batches to one shape (CUDA graphs, a compile) gets every bucket up to the limit
        warmed (twice: a graph is captured on a shape's second use) and pads to the smallest that holds a batch:
        a service's batches are as large as the traffic of the moment, and padding 13 faces to a limit of 64 cost
        five times their generator time (one face alone: 73 ms instead of ~3 ms, GPEN-BFR-512 on an H100).
        `detector` False: this process's detector is left for its first use (request processes detect the
        requests; it serves only the jobs)."""
        if detector:
            self.warm_up_detector()
        size = self.pipeline.size
        inner = self.pipeline.restorer                   # the setting lives on the restorer, not on the lock's wrapper
        sizes = sizes_up_to(inner.limit)
        if inner.one_shape:
            inner.pad_to_buckets = True             # each size padded_size gives is warmed below
        grey = np.full((size, size, 3), 128, np.uint8)
        for b in sizes if inner.one_shape else [1]:
            for _ in range(2 if inner.one_shape else 1):
                self.restorer.submit([grey] * b).result()

    def warm_up_detector(self) -> None:
        """The detector service started (a process: ~10 s), its P-Net graphs captured for every batch size (a
        detector process captures its own), and used once."""
        if self.pipeline.settings.aligned:
            return
        detector = self.detector()
        capture = getattr(getattr(detector, "inner", detector), "capture_graphs", None)
        if capture is not None:
            capture()
        detector.detect([np.full((64, 64, 3), 128, np.uint8)])

    # -- the three calls -----------------------------------------------------------------------------------------
    def prepare(self, path: Path, name: str, options: RequestOptions) -> Prepared:
        """Decode, detect, align and cut one image file; RequestError / ImageReadError for what cannot be used."""
        self._on_device()
        stages = self._stages_for(options)
        job = ImageJob(source=name, stem="result")
        job.load = lambda: str(path)
        stages.prepare([job])
        if job.status == "error":
            raise ImageReadError(job.error or f"{name}: cannot be read")
        crops = [f.crop for f in job.faces] if job.waiting else []
        return Prepared(job, stages, crops, [None] * len(crops), [None] * len(crops))

    def restore(self, faces: Sequence[FaceRef]) -> None:
        """One generator call for `faces` (at most `limit`), their parse masks behind it; results on each Prepared."""
        self._on_device()
        t = time.perf_counter()
        pending = self.restorer.submit([p.crops[k] for p, k in faces])   # collected (a repaired batch too)
        out, batch = pending.result(), pending.device_out
        share = (time.perf_counter() - t) / len(faces)
        for p, _ in faces:
            p.add_time("restore", share)
        for idx, stages in self._parse_groups(faces):
            rows = _rows(batch, idx)
            stages.keep_masks([(faces[i][0].job, faces[i][1]) for i in idx], rows)
        for i, ((p, k), restored) in enumerate(zip(faces, out, strict=True)):
            p.restored[k] = restored
            if p.on_device:                                       # pasted on the GPU: its row stays there
                p.restored_device[k] = batch[i]

    def take_restored(self, prepared: Prepared, rows: np.ndarray) -> None:
        """Faces restored by another process's generator [N, S, S, 3] uint8 onto `prepared`: their parse masks
        made here and, for an image pasted on the GPU, the rows uploaded (what `restore` leaves on the device)."""
        self._on_device()
        stages, job = prepared.stages, prepared.job
        prepared.restored = list(rows)
        if stages.parser is None and not job.on_device:
            return
        import torch  # heavy: torch, loaded with the pipeline already

        batch = torch.from_numpy(rows).to(self.device)
        if job.on_device:
            prepared.restored_device = list(batch.unbind(0))
        stages.keep_masks([(job, k) for k in range(len(rows))], batch)

    def finish(self, prepared: Prepared, folder: Path, ext: str | None) -> Path:
        """Paste the restored faces back and write the image into `folder` (atomically, as `enhance` does)."""
        self._on_device()
        job = prepared.job
        for face, restored, on_gpu in zip(job.faces, prepared.restored, prepared.restored_device,
                                          strict=False):          # none when strength is 0
            face.restored, face.restored_device = restored, on_gpu
        prepared.stages.paste(job)
        sink = FileSink(OutputNaming(folder, ext=ext))
        path = sink.write(job)
        job.release()
        if path is None:
            raise ImageReadError(job.error or f"{job.source}: not written")
        return path

    def close(self) -> None:
        self.pipeline.close()

    # -- videos (jobs) -------------------------------------------------------------------------------------------
    def video_info(self, path: Path, name: str) -> tuple[str, int, int]:
        """(the extension a video upload is stored under, frame width, height): from its name, else its
        container; RequestError when it is no video this pipeline reads."""
        from gpen_tune.video.reader import VideoReadError, probe  # heavy: av (PyAV), only for video jobs

        try:
            info = probe(path)
        except VideoReadError as e:
            raise RequestError(" ".join(str(e).split()).replace(str(path), name)) from None
        own = Path(name).suffix.lower().lstrip(".")
        ext = own if own in VIDEO_EXTS else "mp4" if "mp4" in info.container.split(",") else "mkv"
        return ext, info.width, info.height

    def enhance_video(self, src: Path, folder: Path, options: RequestOptions,
                      progress: Callable[[float], None]) -> tuple[Path | None, int]:
        """The pipeline's video run (tracking, ordered encoding, audio kept) on the shared generator; `progress`
        gets the share of frames done after each frame (it may raise KeyboardInterrupt to stop: nothing is
        written then). (output or None when stopped, faces restored)."""
        from gpen_tune.pipeline.video import enhance_video  # heavy: av (PyAV), only for video jobs
        from gpen_tune.video.reader import probe  # heavy: av (PyAV), only for video jobs

        pipe = self.pipeline
        settings = replace(pipe.settings, strength=options.strength, only_center_face=options.only_center_face,
                           parse_mask=pipe.settings.parse_mask if options.parse_mask is None else options.parse_mask)
        ext = options.ext if options.ext in VIDEO_EXTS else src.suffix.lstrip(".")
        expected = max(1, probe(src).expected_frames or 1)
        done = [0]

        def frame_done(job: ImageJob) -> None:
            done[0] += 1
            progress(min(1.0, done[0] / expected))

        with Pipeline(settings, pipe.tune, restorer=self.restorer, cut_on_device=False, notify=pipe.notify) as run:
            result = enhance_video(src, folder / f"result.{ext}", run, on_result=frame_done, notify=pipe.notify)
        return result.output, result.faces

    # -- helpers -------------------------------------------------------------------------------------------------
    def detector_spec(self, shares: int = 1) -> DetectorSpec:
        """What a detector process needs to build this service's detector (`--shared-detector`); on the CPU with
        the torch threads of `shares` detectors (the request processes' it replaces)."""
        spec = DetectorSpec.of(self.detector())
        if self.device.type != "cpu" or not spec.torch_threads:
            return spec
        return replace(spec, torch_threads=min(usable_cores(), spec.torch_threads * shares))

    def detector(self) -> Any:
        """The detector service every request shares: a batching thread, or with `detector_process` a process of
        its own (its own GIL: under many concurrent requests the detector thread waited on the GIL)."""
        return self.pipeline.detector(self.pipeline.threaded_service)

    def _stages_for(self, options: RequestOptions) -> PipelineSteps:
        pipe = self.pipeline
        use_parser = options.parse_mask is not False
        if options.parse_mask and pipe.parser is None:
            raise RequestError("parse_mask=true: this server has no ParseNet weights (start it with "
                               "--parse-weights PATH)")
        key = (options.strength, options.only_center_face, use_parser)
        with self._lock:
            stages = self._stages.get(key)
            if stages is None:
                if len(self._stages) >= STAGES_KEPT:
                    self._stages.pop(next(iter(self._stages)))
                settings = replace(pipe.settings, strength=options.strength,
                                   only_center_face=options.only_center_face)
                stages = PipelineSteps(settings, size=pipe.size, device=pipe.device, detector=self.detector(),
                                       parser=pipe.parser if use_parser else None, face_crop=pipe.tune.face_crop,
                                       cut_on_device=False, paste_impl=pipe.paste_impl)
                self._stages[key] = stages
        return stages

    def _on_device(self) -> None:
        """Threads start on GPU 0: a server on cuda:N makes the calling thread's current device N (as the threaded
        scheduler's threads do)."""
        device = self.pipeline.device
        if device.type == "cuda" and device.index is not None:
            import torch  # heavy: torch, loaded with the pipeline already

            torch.cuda.set_device(device)

    @staticmethod
    def _parse_groups(faces: Sequence[FaceRef]) -> list[tuple[list[int], PipelineSteps]]:
        """Faces grouped by parser (with / without the mask): each group's masks are one parser call. Faces
        prepared in a request process (no stages here) get their masks there."""
        groups: dict[int, tuple[list[int], PipelineSteps]] = {}
        for i, (p, _) in enumerate(faces):
            if p.stages is not None:
                groups.setdefault(id(p.stages.parser), ([], p.stages))[0].append(i)
        return list(groups.values())


def _rows(batch: Any, idx: list[int]) -> Any:
    """The rows `idx` of a restored batch (the batch itself when they are all of it, in order)."""
    if batch is None or idx == list(range(batch.shape[0])):
        return batch
    return batch[idx]
