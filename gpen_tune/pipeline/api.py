"""`Pipeline`: the built pipeline (restorer, detector, parser) and the two entry points users call.

    import gpen_tune
    restored = gpen_tune.enhance_image("photo.jpg", device="cuda")                      # one image in memory
    result = gpen_tune.enhance(["albums/"], "restored/", tune=gpen_tune.preset("speed"))  # many inputs to disk

A `Pipeline` is reusable: build it once (the generator, its switches, the detector) and `run` sources into
sinks; `close()` releases the detector process and the parser.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpen_tune.choices import DETECTOR_NAMES
from gpen_tune.device_memory import trim_host_heap
from gpen_tune.extras import require
from gpen_tune.face.detect import BatchingDetector, default_notify, init_detector, serve
from gpen_tune.face.detect.services import call_summary
from gpen_tune.face.detect.warm import DetectorWarmUp
from gpen_tune.face.parse import load_parser
from gpen_tune.imageio import ImageReadError, Picture
from gpen_tune.load import load_model
from gpen_tune.ops.triton_support import hash_compiler_in_background
from gpen_tune.pipeline.conflicts import check_detector_process
from gpen_tune.pipeline.job import ImageJob, one_line_text
from gpen_tune.pipeline.outputs import (
    Inputs,
    OutputNaming,
    SideImages,
    check_output_dir,
    collect_inputs,
    is_video,
    plan_outputs,
    remove_stale_temp_files,
)
from gpen_tune.pipeline.scheduler import RunSummary, SchedulerConfig, few_cpu_cores, run_serial, serial_by_default
from gpen_tune.pipeline.settings import EnhanceSettings, check_weights, resolve_device, resolve_weights
from gpen_tune.pipeline.sinks import FileSink, MemorySink, Sink
from gpen_tune.pipeline.sources import ArraySource, FileSource, Source
from gpen_tune.pipeline.steps import Steps
from gpen_tune.pipeline.threads import run_threaded
from gpen_tune.restore import Restorer, build_restorer, default_batch_size
from gpen_tune.tune.options import TuneConfig, resolve_preset


class Pipeline:
    """Settings + TuneConfig -> the generator behind its switches, the detector and the parser, ready to run.

    Args:
        settings: the pipeline's choices (EnhanceSettings).
        tune: the generator's switches (TuneConfig; None = all off but face_crop).
        model: a loaded generator to use instead of loading `settings.weights`.
        restorer: a built Restorer (tests, benchmarks); wins over `model` and `tune`.
        detector: a face detector to use instead of building one from settings (the caller closes it).
        paste_impl: the device crop/paste kernels' implementation ("auto" | "triton" | "torch").
        cut_on_device: cut the faces of device-pasted images on the device.
        warm_detector: build the detector and run it once on a thread while the generator loads (None: on CUDA,
            where the first detection's one-off set-up is worth hiding; see `gpen_tune.face.detect.warm`).
        notify: where one-line notices go (the CLI prints them on stderr).
    """

    def __init__(self, settings: EnhanceSettings | None = None, tune: TuneConfig | None = None, *,
                 model: torch.nn.Module | None = None, restorer: Restorer | None = None, detector: Any = None,
                 paste_impl: str = "auto", cut_on_device: bool = True, warm_detector: bool | None = None,
                 notify: Callable[[str], None] = default_notify):
        self.settings = settings or EnhanceSettings()
        self.tune = tune or TuneConfig()
        self.notify = notify
        self.paste_impl = paste_impl
        self.cut_on_device = cut_on_device
        self._given_detector = detector
        self._warm_up: DetectorWarmUp | None = None    # the inline detector, built and run once beside the loading
        if restorer is None:
            device = (next(model.parameters()).device if model is not None
                      else resolve_device(self.settings.device, notify, model=self.settings.model))
            if model is None:
                hash_compiler_in_background(device)     # the kernels' cache key, while the weights load
                self._warm_up = self._detector_warm_up(device, warm_detector)
                model = load_model(resolve_weights(self.settings, notify), model=self.settings.model, device=device)
            batch = self.settings.batch_size or default_batch_size(device, low_memory=self.tune.act_checkpoint)
            restorer = build_restorer(model, self.tune, device=device, max_batch=batch)
            for msg in restorer.fallbacks:
                notify(msg)
        self.restorer = restorer
        self.device = restorer.device
        self.size = restorer.size
        self.weights_source = getattr(getattr(restorer, "model", None), "weights_source", None)
        self._detector_name: str | None = None   # what "auto" chose (prepare), for every later service
        self._detectors: dict[str, Any] = {}
        self._detector_calls: dict[str, dict[str, Any]] = {}   # of services closed (detector_calls)
        self._parser: Any = None
        self._parser_loaded = False
        self._upscaler: Any = None

    # -- parts built on first use ------------------------------------------------------------------------------
    def _detector_warm_up(self, device: torch.device, warm: bool | None) -> DetectorWarmUp | None:
        """The inline detector built and run once on a thread while the generator loads (`warm_detector`; see
        `gpen_tune.face.detect.warm`); None where not wanted or not applicable (aligned inputs, a given or a lazy
        detector)."""
        s = self.settings
        wanted = device.type == "cuda" if warm is None else warm
        if not wanted or s.aligned or self._given_detector is not None or self.tune.lazy_detector:
            return None
        return DetectorWarmUp(lambda: init_detector(s.detector, device=device, weights=s.detector_weights,
                                                    threshold=s.det_threshold, det_size=s.det_size,
                                                    notify=self.notify, service="inline"))

    def _warm_detector(self) -> Any:
        """The warm-up's detector (once; None when there was none or it failed)."""
        warm, self._warm_up = self._warm_up, None
        return None if warm is None else warm.result()

    def detector(self, service: str = "inline") -> Any:
        """The face detector for a run mode: "inline" (serial), "thread" or "process" (threaded runs)."""
        if service == "inline" and service not in self._detectors and (warm := self._warm_detector()) is not None:
            self._detectors[service] = warm
        if service not in self._detectors and self._given_detector is not None:
            self._detectors[service] = serve(self._given_detector, service, self.settings.detector_processes)
        if service not in self._detectors:
            s = self.settings
            self._detectors[service] = init_detector(
                self._detector_name or s.detector, device=self.device, weights=s.detector_weights,
                threshold=s.det_threshold, det_size=s.det_size, notify=self.notify, service=service,
                lazy=self.tune.lazy_detector, processes=s.detector_processes)
        return self._detectors[service]

    def detector_calls(self) -> dict[str, dict[str, Any]]:
        """What each batching detector service did (calls, images, calls by size, busy time), by service ("thread",
        "process"); kept after `close`, for the run report."""
        live = {k: s for k, d in self._detectors.items() if (s := call_summary(d)) is not None}
        return {**self._detector_calls, **live}

    @property
    def parser(self) -> Any:
        """The ParseNet mask (settings.parse_mask None: when its weights are available, said once otherwise;
        True: required; False: none) or None for the feathered mask."""
        if not self._parser_loaded:
            s = self.settings
            if not s.aligned and s.strength > 0:
                self._parser = load_parser(s.parse_mask, self.device, s.parse_weights, self.notify)
            self._parser_loaded = True
        return self._parser

    @property
    def upscaler(self) -> Any:
        """The background upscaler of settings.bg_upsampler (None when not asked for)."""
        s = self.settings
        if self._upscaler is None and s.bg_upsampler is not None:
            require("spandrel")
            from gpen_tune.background.upscale import load_upscaler  # optional: spandrel

            self._upscaler = load_upscaler(s.bg_upsampler, s.upscale, s.bg_weights, self.device, s.tile,
                                           self.notify)
        return self._upscaler

    def steps(self, sink: Sink | None = None, service: str | None = "inline", *, save_faces: bool = False,
              tracker: Any = None, save_mask: bool = False) -> Steps:
        """The three calls of `gpen_tune.pipeline.steps` over this pipeline's parts, for one run into `sink`
        (`service`: the detector's, "inline" for one thread, "thread" or "process" for many; None for a caller
        that does not prepare)."""
        s = self.settings
        check_detector_process(service == "process", self.tune.lazy_detector)
        detector = None if s.aligned or service is None else self.detector(service)
        return Steps(s, self.restorer, sink, detector=detector, parser=self.parser, upscaler=self.upscaler,
                     face_crop=self.tune.face_crop, cut_on_device=self.cut_on_device, paste_impl=self.paste_impl,
                     save_faces=save_faces, save_mask=save_mask, tracker=tracker,
                     before_restore=self._release_hook())

    def prepare(self) -> str | None:
        """Build the detector and the parser now, so a missing weights file fails before any image; returns the
        detector's name (None for aligned inputs)."""
        _ = self.upscaler
        if self.settings.aligned:
            return None
        _ = self.parser
        name = self.detector("inline").name
        if self.settings.detector == "auto" and name in DETECTOR_NAMES:
            self._detector_name = name   # auto decided once: later services are built without asking (or saying) again
        if self.device.type == "cpu":
            trim_host_heap()             # the weights' fp32 copies freed by the cast: back to the OS
        return name

    # -- running -----------------------------------------------------------------------------------------------
    def run(self, source: Source, sink: Sink, *, serial: bool = False,
            config: SchedulerConfig = SchedulerConfig(), on_result: Callable[[ImageJob], None] | None = None,
            on_faces: Callable[[int], None] | None = None, save_faces: bool = False,
            tracker: Any = None, save_mask: bool = False) -> RunSummary:
        """Every item of `source` into `sink`: the serial path inline, else the threaded scheduler.

        `on_result(job)` is called per finished image, `on_faces(n)` as each batch of n faces is restored (both in
        the calling thread for the serial path; `on_faces` from the GPU stage's thread when threaded).
        `tracker`: for an ordered source (video), called in source order between detection and alignment."""
        if serial:
            steps = self.steps(sink, "inline", save_faces=save_faces, tracker=tracker, save_mask=save_mask)
            return run_serial(source, steps, batch_size=self.settings.batch_size, on_result=on_result,
                              on_faces=on_faces)
        steps = self.steps(sink, self.threaded_service, save_faces=save_faces, tracker=tracker, save_mask=save_mask)
        return run_threaded(source, steps, config, on_result=on_result, on_faces=on_faces)

    @property
    def threaded_service(self) -> str:
        """The detector service of many-threaded runs: "process" with `settings.detector_process`, else "thread"."""
        return "process" if self.settings.detector_process else "thread"

    def _release_hook(self) -> Callable[[], None] | None:
        """The lazy detector's release before generator batches (None when the detector is not lazy)."""
        if not self.tune.lazy_detector or self.settings.aligned:
            return None
        return lambda: [d.before_restore() for d in self._detectors.values()]

    def enhance_image(self, image: str | Path | np.ndarray | Picture) -> np.ndarray:
        """Restore every face of one image; the result as an array (gray, RGB or RGBA, as the input)."""
        source = FileSource([image]) if isinstance(image, str | Path) else ArraySource([image])
        sink = MemorySink()
        summary = self.run(source, sink, serial=True)
        job = summary.results[0]
        if job.status == "error":
            raise ImageReadError(job.error)
        return sink.results[0]

    def close(self) -> None:
        warm = self._warm_detector()                         # a warm-up nobody took: wait for it, then close it
        if warm is not None:
            warm.close()
        self._detector_calls = self.detector_calls()
        for det in self._detectors.values():
            if det is self._given_detector:
                continue                                     # the caller's: the caller closes it
            if self._given_detector is not None and isinstance(det, BatchingDetector):
                det.close(inner=False)
            else:
                det.close()
        if self._parser is not None:
            self._parser.close()
        self._detectors.clear()
        self._parser, self._parser_loaded, self._upscaler = None, False, None

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InputError(ValueError):
    """The inputs name nothing to restore (every name missing or empty); raised before any work (one line)."""


@dataclass
class EnhanceResult:
    """What `enhance` did: the run's jobs (source order), plus what never entered it.

    `summary.wall_s` is the whole call (photos and videos); a video is one job whose `video` holds its frames and
    faces, so `images` counts photos and `frames` video frames."""

    summary: RunSummary
    missing: list[str]                   # names on the command line that gave nothing (one line each)
    passed_over: list[str]               # folder entries that were not inputs, with the reason
    refused: list[ImageJob]              # existing outputs not replaced (no --overwrite)
    skipped: list[ImageJob]              # existing outputs kept (--skip-existing)
    nonfinite_faces: int = 0             # faces the generator gave non-finite output for (left as the input)

    @property
    def jobs(self) -> list[ImageJob]:
        return sorted(self.summary.results + self.refused + self.skipped, key=lambda j: j.index)

    @property
    def failed(self) -> int:
        return self.summary.failed + len(self.refused) + len(self.missing)

    @property
    def wall_s(self) -> float:
        return self.summary.wall_s

    @property
    def faces(self) -> int:
        """Faces restored, in photos and video frames."""
        return self.summary.faces

    @property
    def frames(self) -> int:
        """Video frames written."""
        return sum(int(j.video.get("frames", 0)) for j in self.summary.results if j.video is not None)

    @property
    def exit_code(self) -> int:
        if self.summary.interrupted:
            return 130
        return 1 if self.failed or self.nonfinite_faces else 0


def enhance(inputs: str | Path | Sequence[str | Path], outdir: str | Path, settings: EnhanceSettings | None = None,
            tune: TuneConfig | None = None, *, pipeline: Pipeline | None = None, recursive: bool = False,
            ext: str | None = None, suffix: str = "", name_pattern: str = "{name}{suffix}.{ext}",
            existing: str = "refuse", save_faces: bool = False, save_comparison: bool = False,
            save_mask: bool = False, serial: bool | None = None, config: SchedulerConfig = SchedulerConfig(),
            on_result: Callable[[ImageJob], None] | None = None, on_faces: Callable[[int], None] | None = None,
            on_start: Callable[[int], None] | None = None, video: VideoOptions | None = None,
            notify: Callable[[str], None] = default_notify, report: str | Path | None = None) -> EnhanceResult:
    """Restore every face of every image named by `inputs` (files, folders, globs) into `outdir`.

    Before any work (no model loaded, no folder created): inputs that name nothing raise `InputError`, missing
    weights `WeightsNotFoundError` (see `resolve_weights`). Outputs are planned before any work (two inputs on one
    output, or an output onto an input, raise `OutputError`); an existing output is refused, replaced or kept by
    `existing` ("refuse" | "overwrite" | "skip"). `tune` None (and no `pipeline`): preset auto for the device.
    `serial` None: the serial path for one photo, and for photos and videos on a CPU of few cores (unless `config`
    sets thread counts), else the threaded scheduler (`serial_by_default`, `few_cpu_cores`); True / False choose
    for photos and videos alike. Videos among the
    inputs go through the same pipeline one after the other (`video`: codec, quality, smoothing), each written
    whole or not at all. `on_start(n)` is told how many images and video frames will run, before the first.
    `report`: the file the caller will write the report to (refused when it is an input or an output). Temp files
    that killed runs left in `outdir` are removed first.
    """
    t0 = time.perf_counter()
    found = collect_existing_inputs(inputs, recursive)
    settings = settings or getattr(pipeline, "settings", None) or EnhanceSettings()   # a given pipeline's own
    require_parts(settings, found)
    if pipeline is None:
        settings, tune = with_default_tune(settings, tune, notify)
    outdir = Path(outdir)
    naming = OutputNaming(outdir, ext=ext, suffix=suffix, pattern=name_pattern, replace=existing == "overwrite")
    check_output_dir(outdir)
    plan = plan_outputs(found.files, naming, existing, SideImages(save_faces, save_comparison, save_mask),
                        None if report is None else Path(report))
    for stale in remove_stale_temp_files(outdir):
        notify(f"removed {stale}: a temporary file of an interrupted earlier run")
    refused = [_job_for(i, found.files[i], "error", msg) for i, msg in plan.refused.items()]
    skipped = [_job_for(i, found.files[i], "skipped", msg) for i, msg in plan.skipped.items()]
    photos = [i for i in plan.run if not is_video(found.files[i][0])]
    videos = [i for i in plan.run if is_video(found.files[i][0])]
    if on_start is not None:
        on_start(len(photos) + sum(_expected_frames(found.files[i][0]) for i in videos))
    own = pipeline is None
    pipe = pipeline or Pipeline(settings, tune, notify=notify)
    nonfinite_before = _nonfinite(pipe)
    try:
        source = FileSource([found.files[i][0] for i in photos], [found.files[i][1] for i in photos])
        sink = FileSink(naming, save_faces, save_comparison, save_mask, png_level=pipe.settings.png_level)
        one_device = isinstance(pipe, Pipeline)   # a pool of devices (`--devices`) shares its cores its own way
        photos_serial = serial if serial is not None else (
            serial_by_default(len(photos), pipe.device.type, config) if one_device else len(photos) <= 1)
        videos_serial = one_device and (few_cpu_cores(pipe.device.type, config) if serial is None else serial)
        summary = pipe.run(source, sink, serial=photos_serial, config=config,
                           on_result=on_result, on_faces=on_faces, save_faces=save_faces, save_mask=save_mask)
        for job in summary.results:                      # back to the numbering of all inputs
            job.index = photos[job.index]
        for i in videos:
            if summary.interrupted:
                summary.results.append(_job_for(i, found.files[i], "dropped", f"{found.files[i][0]}: not "
                                                "processed (interrupted)"))
                continue
            job, interrupted = _run_video(pipe, i, found.files[i], naming, video, config, videos_serial, on_result,
                                          on_faces, notify)
            summary.results.append(job)
            summary.interrupted = summary.interrupted or interrupted
    finally:
        if own:
            pipe.close()
    summary.wall_s = time.perf_counter() - t0           # the whole call: videos and the model's loading too
    nonfinite = _nonfinite(pipe) - nonfinite_before
    if nonfinite:
        notify(f"{nonfinite} faces gave a non-finite generator output and were left as the input: the weights may be "
               "damaged (check them with `gpen-tune weights verify`)")
    return EnhanceResult(summary, found.missing, found.passed_over, refused, skipped, nonfinite)


def collect_existing_inputs(inputs: str | Path | Sequence[str | Path], recursive: bool = False) -> Inputs:
    """The inputs' files (as `collect_inputs`); raises InputError when they name no file at all, so a typo fails
    before the model loads and before the output folder is created."""
    names = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    found = collect_inputs([str(n) for n in names], recursive)
    if not found.files:
        raise InputError("; ".join(found.missing) if found.missing else
                         "no input given: pass files, folders or globs")
    return found


def require_parts(settings: EnhanceSettings, found: Inputs) -> None:
    """MissingPart (one line naming the extra to install) when the settings or the inputs need an optional part
    that is not installed: spandrel for a background upscaler, PyAV for videos."""
    if settings.bg_upsampler is not None:
        require("spandrel")
    if any(is_video(path) for path, _ in found.files):
        require("av")


def with_default_tune(settings: EnhanceSettings | None, tune: TuneConfig | None,
                      notify: Callable[[str], None] = default_notify) -> tuple[EnhanceSettings, TuneConfig | None]:
    """Settings whose weights exist (else WeightsNotFoundError, before any work) and, for `tune` None, preset auto
    for their device (the device decided here once, so its notice is given once)."""
    settings = settings or EnhanceSettings()
    check_weights(settings)
    if tune is not None:
        return settings, tune
    device = resolve_device(settings.device, notify, model=settings.model)
    return replace(settings, device=str(device)), resolve_preset("auto", device)[1]


def _nonfinite(pipe: Any) -> int:
    """Faces the generator left as the input so far (a pool of worker processes counts them in the workers)."""
    return int(getattr(getattr(pipe, "restorer", None), "nonfinite_faces", 0) or 0)


@dataclass(frozen=True)
class VideoOptions:
    """How videos are written: encoder (None = the input's codec family), quality, landmark smoothing, and how
    often the full detector runs (`detect_every`: 1 = every frame; see `gpen_tune.pipeline.keyframes`)."""

    codec: str | None = None
    crf: float | None = None
    smooth: bool = True
    encoder_preset: str | None = None       # libx264/libx265 speed preset (None: medium)
    detect_every: int = 1


def _expected_frames(path: Path) -> int:
    from gpen_tune.video.reader import VideoReadError, probe  # optional: PyAV, only when videos are given

    try:
        return probe(path).expected_frames or 0
    except VideoReadError:
        return 0


def _run_video(pipe: Pipeline, index: int, file: tuple[Path, str], naming: OutputNaming,
               options: VideoOptions | None, config: SchedulerConfig, serial: bool, on_result, on_faces, notify
               ) -> tuple[ImageJob, bool]:
    """One video as one job of the run's results (its frames' own jobs stay inside); (job, interrupted)."""
    from gpen_tune.pipeline.video import enhance_video  # heavy: av (PyAV), only when a video is among the inputs
    from gpen_tune.video.reader import VideoReadError  # heavy: av (PyAV), only when a video is among the inputs
    from gpen_tune.video.writer import VideoWriteError  # heavy: av (PyAV), only when a video is among the inputs

    options = options or VideoOptions()
    path, stem = file
    job = ImageJob(source=str(path), index=index, stem=stem)
    dst = naming.planned(stem, path)
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        result = enhance_video(path, dst, pipe, codec=options.codec, crf=options.crf, smooth=options.smooth,
                               encoder_preset=options.encoder_preset, detect_every=options.detect_every,
                               config=config, serial=serial, on_result=on_result,
                               on_faces=on_faces, notify=notify, replace=naming.replace)
    except (VideoReadError, VideoWriteError, OSError, ValueError) as e:
        job.fail(" ".join(str(e).split()) if str(path) in str(e) else f"{path}: {' '.join(str(e).split())}")
        return job, False
    frames = result.summary.results
    job.video = {"frames": result.frames, "faces": result.faces, "decode_problems": result.decode_problems,
                 "passed_through": result.passed_through, "notes": result.notes,
                 "frame_errors": sum(f.status == "error" for f in frames)}
    for frame in frames:
        for k, v in frame.timings.items():
            job.add_time(k, v)
    job.output = result.output
    job.status = "dropped" if result.summary.interrupted else "ok"
    if result.summary.interrupted:
        job.error = f"{path}: interrupted after {result.frames} frames; no partial file written"
    return job, result.summary.interrupted


def _job_for(index: int, file: tuple[Path, str], status: str, message: str) -> ImageJob:
    job = ImageJob(source=str(file[0]), index=index, stem=file[1])
    job.status, job.error = status, one_line_text(message)
    return job


def enhance_image(image: str | Path | np.ndarray, settings: EnhanceSettings | None = None, *,
                  tune: TuneConfig | None = None, pipeline: Pipeline | None = None, **overrides: Any) -> np.ndarray:
    """Restore every face of one image; returns the result as an array (gray, RGB or RGBA, as the input).

    Example: `gpen_tune.enhance_image("photo.jpg", weights="GPEN-BFR-512", device="cuda")`; keyword overrides
    are EnhanceSettings fields. `tune` None: preset auto for the device. Without weights and without the cached
    official file this raises WeightsNotFoundError before any work (`weights="synthetic"` for a dry run)."""
    if pipeline is not None:
        return pipeline.enhance_image(image)
    if settings is None:
        settings = EnhanceSettings(**overrides)
    elif overrides:
        settings = replace(settings, **overrides)
    require_parts(settings, Inputs())                     # before the model loads, as enhance
    settings, tune = with_default_tune(settings, tune)
    with Pipeline(settings, tune) as pipe:
        return pipe.enhance_image(image)
