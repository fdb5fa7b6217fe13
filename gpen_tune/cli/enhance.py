"""`gpen-tune enhance INPUT... -o OUTDIR`: restore every face of photos and folders (a thin layer over
`gpen_tune.pipeline.api.enhance`)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gpen_tune import __version__
from gpen_tune.cli import app
from gpen_tune.cli._console import err, fail, failure, notice, out, user_errors
from gpen_tune.cli._options import (
    AmpOpt,
    BackendOpt,
    CheckpointOpt,
    CompileOpt,
    CudaGraphOpt,
    FaceCropOpt,
    FusedOpt,
    LazyDetectorOpt,
    PresetOpt,
    tune_config_from_options,
)
from gpen_tune.cli._options import panel_option as _opt  # short: it is on every option line
from gpen_tune.cli._progress import EnhanceProgress, print_summary
from gpen_tune.distributed.ray_import import RayMissing, check_ray

IO_PANEL = "Inputs and outputs"
FACE_PANEL = "Faces"
MODEL_PANEL = "Model and device"
DETECT_PANEL = "Detection and alignment"
PERF_PANEL = "Performance"
VIDEO_PANEL = "Video"
BG_PANEL = "Background"
SCALE_PANEL = "Scale-out"

EXAMPLES = """
Examples:\n
  gpen-tune enhance photo.jpg -o out/\n
  gpen-tune enhance albums/ -r -o restored/ --preset auto --report report.json\n
  gpen-tune enhance 'scans/*.png' -o out/ -w 0.7 --ext jpg --suffix _gpen --skip-existing\n
  gpen-tune enhance clip.mp4 photos/ -o out/ --codec libx265
"""


class DetectorChoice(str, Enum):
    auto = "auto"
    retinaface_resnet50 = "retinaface_resnet50"
    retinaface_mobile = "retinaface_mobile0.25"
    mtcnn = "mtcnn"


class TemplateChoice(str, Enum):
    gpen = "gpen"
    ffhq = "ffhq"


class DeviceChoice(str, Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"
    mps = "mps"


@app.command(epilog=EXAMPLES)
def enhance(
    inputs: Annotated[list[str] | None, typer.Argument(help="Image and video files, folders or glob patterns.",
                                                       show_default=False)] = None,
    input_: Annotated[list[str] | None, _opt("-i", "--input", panel=IO_PANEL, show_default=False,
                                             help="An input, as the positional arguments (repeatable).")] = None,
    output: Annotated[str, _opt("-o", "--output", panel=IO_PANEL, show_default=False,
                                 help="Output folder, created (default out; with --ray also s3://...).")] = "out",
    recursive: Annotated[bool, _opt("-r", "--recursive", panel=IO_PANEL, help="Descend into sub-folders.")] = False,
    ext: Annotated[str | None, _opt("--ext", panel=IO_PANEL, help="jpg, png, webp, bmp, tiff; mp4, mkv, mov, webm "
                                    "(default: as the input).")] = None,
    suffix: Annotated[str, _opt("--suffix", panel=IO_PANEL, help="Added to every output name.")] = "",
    name_pattern: Annotated[str, _opt("--name-pattern", panel=IO_PANEL, show_default=False,
                                      help="File name from {name}, {suffix}, {ext} (default {name}{suffix}.{ext})."
                                      )] = "{name}{suffix}.{ext}",
    overwrite: Annotated[bool, _opt("--overwrite", panel=IO_PANEL, help="Replace outputs that already exist.")]
    = False,
    skip_existing: Annotated[bool, _opt("--skip-existing", panel=IO_PANEL,
                                        help="Keep outputs that already exist (resume a batch).")] = False,
    png_level: Annotated[int, _opt("--png-level", panel=IO_PANEL, metavar="0..9", show_default=False,
                                   help="PNG compression: 0 fastest and biggest, 9 smallest (default 3).")] = 3,
    report: Annotated[Path | None, _opt("--report", panel=IO_PANEL,
                                        help="Write a JSON report: status, faces and timings per image.")] = None,
    save_faces: Annotated[bool, _opt("--save-faces", panel=IO_PANEL,
                                     help="Also write each aligned face beside its restoration (OUT/faces/).")]
    = False,
    save_comparison: Annotated[bool, _opt("--save-comparison", panel=IO_PANEL,
                                          help="Also write input | output side by side (OUT/comparisons/).")]
    = False,
    save_mask: Annotated[bool, _opt("--save-mask", panel=IO_PANEL,
                                    help="Also write the paste's blend weights as a grey image (OUT/masks/).")]
    = False,
    strength: Annotated[float, _opt("-w", "--strength", panel=FACE_PANEL, metavar="0..1", show_default=False,
                                    help="Restored over original: 0 = unchanged, 1 = restored (default).")] = 1.0,
    aligned: Annotated[bool, _opt("--aligned", panel=FACE_PANEL, help="Inputs are aligned face crops.")] = False,
    only_center_face: Annotated[bool, _opt("--only-center-face", panel=FACE_PANEL,
                                           help="Restore only the face nearest the centre.")] = False,
    only_center_face_alias: Annotated[bool, typer.Option("--only_center_face", hidden=True,
                                                         help="GFPGAN's spelling of --only-center-face.")] = False,
    parse_mask: Annotated[bool | None, _opt("--parse-mask/--no-parse-mask", panel=FACE_PANEL, show_default=False,
                                            help="Paste through ParseNet's face mask (default: when available).")]
    = None,
    parse_weights: Annotated[str | None, _opt("--parse-weights", panel=FACE_PANEL, metavar="PATH",
                                              help="ParseNet weights (upstream's or facexlib's file).")] = None,
    bg_upsampler: Annotated[str | None, _opt("--bg-upsampler", panel=BG_PANEL, metavar="KIND",
                                             help="Upscale the photo first: realesrnet or realesrgan.")] = None,
    upscale: Annotated[int, _opt("--upscale", panel=BG_PANEL, metavar="2|4", show_default=False,
                                 help="Background upscale factor (default 2).")] = 2,
    bg_weights: Annotated[str | None, _opt("--bg-weights", panel=BG_PANEL, metavar="PATH",
                                           help="Upscaler weights file (for offline use).")] = None,
    tile: Annotated[int, _opt("--tile", panel=BG_PANEL, metavar="PX", show_default=False,
                              help="Upscale in overlapping tiles of PX (default 0: whole photo).")] = 0,
    model: Annotated[str, _opt("--model", panel=MODEL_PANEL, show_default=False,
                               help="GPEN-BFR-256, -512 (default), -1024 or -2048.")] = "GPEN-BFR-512",
    weights: Annotated[str | None, _opt("--weights", panel=MODEL_PANEL, metavar="PATH|NAME",
                                        help="A .pth file, a registry name or 'synthetic' (default: cached).")] = None,
    device: Annotated[DeviceChoice, _opt("--device", panel=MODEL_PANEL, show_default=False,
                                         help="auto (default) = cuda > mps > cpu.")] = DeviceChoice.auto,
    detector: Annotated[DetectorChoice, _opt("--detector", panel=DETECT_PANEL, metavar="NAME", show_default=False,
                                             help="retinaface_resnet50, retinaface_mobile0.25, mtcnn or auto.")]
    = DetectorChoice.auto,
    detector_weights: Annotated[str | None, _opt("--detector-weights", panel=DETECT_PANEL, metavar="PATH",
                                                 help="RetinaFace weights file or URL.")] = None,
    det_size: Annotated[int | None, _opt("--det-size", panel=DETECT_PANEL, show_default=False, metavar="PX",
                                         help="Long side of the detection copy (default 1024; 0 = native).")]
    = None,
    det_threshold: Annotated[float | None, _opt("--det-threshold", panel=DETECT_PANEL, metavar="0..1",
                                                help="Minimum face score (default 0.9).")] = None,
    template: Annotated[TemplateChoice, _opt("--template", panel=DETECT_PANEL, show_default=False,
                                             help="Alignment: gpen (default, upstream) or ffhq (GFPGAN).")]
    = TemplateChoice.gpen,
    batch_size: Annotated[int | None, _opt("--batch-size", panel=PERF_PANEL, show_default=False, metavar="N",
                                           help="Faces per generator call (default: 32 on CUDA, 8 elsewhere).")]
    = None,
    workers: Annotated[int | None, _opt("--workers", panel=PERF_PANEL, show_default=False, metavar="N",
                                        help="Paste/encode threads (default: half the cores, 1..8).")] = None,
    serial: Annotated[bool, _opt("--serial", panel=PERF_PANEL,
                                 help="One step at a time instead of the pipelined threads.")] = False,
    detector_process: Annotated[bool, _opt("--detector-process", panel=PERF_PANEL,
                                           help="Run the detector in its own process (big folders on a GPU).")]
    = False,
    codec: Annotated[str | None, _opt("--codec", panel=VIDEO_PANEL, metavar="NAME", help="Video encoder, e.g. "
                                      "libx265, h264_nvenc (default: the input's codec family).")] = None,
    crf: Annotated[float | None, _opt("--crf", panel=VIDEO_PANEL, metavar="Q", help="Video quality, lower is "
                                      "better (default: visually lossless for the codec).")] = None,
    smooth: Annotated[bool, _opt("--smooth/--no-smooth", panel=VIDEO_PANEL, show_default=False,
                                 help="Track faces and smooth their landmarks across frames (default: on).")] = True,
    video_preset: Annotated[str | None, _opt("--video-preset", panel=VIDEO_PANEL, metavar="NAME",
                                             show_default=False, help="x264/x265 speed preset (default medium; "
                                             "veryfast with --preset speed).")] = None,
    devices: Annotated[str | None, _opt("--devices", panel=SCALE_PANEL, show_default=False, metavar="LIST",
                                        help="Run on several GPUs of this host: all, or numbers such as 0,1,3.")]
    = None,
    ray: Annotated[bool, _opt("--ray", panel=SCALE_PANEL, help="Run on a Ray cluster (a local one without "
                              "--ray-address).")] = False,
    ray_address: Annotated[str | None, _opt("--ray-address", panel=SCALE_PANEL, show_default=False,
                                            metavar="ADDR", help="The Ray cluster to join, e.g. auto or "
                                            "ray://head:10001.")] = None,
    preset: PresetOpt = None,
    lazy_detector: LazyDetectorOpt = None,
    compile: CompileOpt = None,
    amp: AmpOpt = None,
    checkpoint: CheckpointOpt = None,
    face_crop: FaceCropOpt = None,
    cuda_graph: CudaGraphOpt = None,
    fused: FusedOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Restore every face in photos and videos: detect, align, restore in batches, paste back seamlessly."""
    # Long for its Typer signature (one annotated parameter per flag); the body only validates and hands over.
    # The checks that need no torch come first, so that they answer at once.
    names = list(inputs or []) + list(input_ or [])
    if not names:
        raise fail("no input given: pass files, folders or globs (or -i PATH)")
    if overwrite and skip_existing:
        raise fail("--overwrite and --skip-existing contradict each other: choose one")
    if devices is not None and (ray or ray_address):
        raise fail("--devices runs on this host, --ray on a Ray cluster: choose one")
    if ray or ray_address is not None:
        try:
            check_ray()                                  # before torch is imported: the answer comes at once
        except RayMissing as e:
            raise fail(str(e)) from None
    from gpen_tune.model.configs import model_info  # heavy: torch (fast --help)
    from gpen_tune.pipeline.api import Pipeline, VideoOptions  # heavy: torch (fast --help)
    from gpen_tune.pipeline.api import enhance as run_enhance  # heavy: torch (fast --help)
    from gpen_tune.pipeline.outputs import check_ext, check_pattern, check_suffix  # heavy: cv2 (fast --help)
    from gpen_tune.pipeline.report import check_report_path  # heavy: torch (fast --help)
    from gpen_tune.pipeline.scheduler import SchedulerConfig  # heavy: torch (fast --help)
    from gpen_tune.pipeline.settings import (  # heavy: torch (fast --help)
        EnhanceSettings,
        detection_size,
        resolve_device,
    )
    from gpen_tune.video_presets import encoder_preset_for

    build, run = Pipeline, run_enhance
    try:                                                 # every argument checked before anything is printed
        model_info(model)
        check_pattern(name_pattern)
        check_suffix(suffix)
        check_ext(ext)
        if report is not None:
            check_report_path(report)
        scale_to_ray = ray or ray_address is not None
        if scale_to_ray and device.value != "cpu":       # the restore actors' device (GPUs of the cluster)
            import torch  # heavy: torch (fast --help)

            dev = torch.device("cuda")
        else:
            dev = resolve_device(device.value, notice)
        encoder_speed = encoder_preset_for(video_preset, getattr(preset, "value", preset))
        tune, origin = tune_config_from_options(preset, lazy_detector, compile, amp, checkpoint, face_crop,
                                                cuda_graph, fused, backend, device=dev.type)
        settings = EnhanceSettings(
            model=model, weights=weights, template=template.value, detector=detector.value,
            detector_weights=detector_weights, det_size=detection_size(det_size, tune.face_crop),
            det_threshold=det_threshold, strength=strength, aligned=aligned,
            only_center_face=only_center_face or only_center_face_alias,
            parse_mask=parse_mask, parse_weights=parse_weights, batch_size=batch_size, device=str(dev),
            detector_process=detector_process, bg_upsampler=bg_upsampler,
            upscale=upscale, bg_weights=bg_weights, tile=tile, png_level=png_level)
        if detector_process and tune.lazy_detector:
            raise ValueError("--detector-process runs the detector in its own process, which --lazy-detector "
                             "cannot release: choose one")
        if devices is not None:
            from gpen_tune.cli._scale import device_pool_builder  # heavy: torch (fast --help)

            build = device_pool_builder(devices)
        if scale_to_ray:
            from gpen_tune.cli._scale import RayRun, ray_runner  # optional: ray (the [ray] extra)

            build, run = RayRun, ray_runner(output, ray_address, 0 if dev.type == "cpu" else 1)
    except user_errors() as e:
        raise failure(e) from None
    out.print(f"optimizations: {origin}", highlight=False, soft_wrap=True)
    existing = "overwrite" if overwrite else "skip" if skip_existing else "refuse"
    code = run_command(names, Path(output), settings, tune, recursive=recursive, ext=ext, suffix=suffix,
                       name_pattern=name_pattern, existing=existing, report=report, save_faces=save_faces,
                       save_comparison=save_comparison, save_mask=save_mask, serial=serial or None,
                       config=SchedulerConfig(workers=workers), build=build, run=run,
                       video=VideoOptions(codec=codec, crf=crf, smooth=smooth, encoder_preset=encoder_speed))
    raise typer.Exit(code)


def run_command(names, output: Path, settings, tune, *, recursive, ext, suffix, name_pattern, existing, report,
                save_faces, save_comparison, serial, config, build, run, video=None, save_mask=False) -> int:
    """Build the pipeline, run every input with progress, print the summary, write the report; the exit code."""
    from gpen_tune.pipeline.outputs import check_output_dir  # heavy: cv2 (fast --help)
    from gpen_tune.pipeline.report import summarize, tune_summary, write_report  # heavy: torch (fast --help)

    created = not output.exists()
    t0 = time.perf_counter()
    try:
        check_output_dir(output)             # an unusable -o fails before the model and its notices
        with _interrupted_while_building(output, created):
            pipe = build(settings, tune, notify=notice)
            detector_name = pipe.prepare()   # a missing detector or parser file fails before any image
    except user_errors() as e:
        _remove_if_empty(output, created)
        raise failure(e) from None
    progress = EnhanceProgress(err)
    try:
        with _interrupts(output), progress:
            result = run(names, output, settings, tune, pipeline=pipe, recursive=recursive, ext=ext, suffix=suffix,
                         name_pattern=name_pattern, existing=existing, save_faces=save_faces,
                         save_comparison=save_comparison, serial=serial, config=config,
                         save_mask=save_mask,
                         on_result=progress.image_done, on_faces=progress.faces_done, on_start=progress.start,
                         video=video, notify=notice, report=report)
    except user_errors() as e:
        _remove_if_empty(output, created)
        raise failure(e) from None
    finally:
        pipe.close()
    summary = summarize(result, time.perf_counter() - t0)
    summary["tune"] = tune_summary(tune, pipe.restorer)
    if hasattr(pipe, "device_summary"):                  # --devices: what each device did
        summary["devices"] = pipe.device_summary()
    print_summary(out, summary, result)
    for lane in summary.get("devices", []):
        lost = f", lost: {lane['lost']} ({lane['retried_elsewhere']} inputs retried elsewhere)" if lane["lost"] else ""
        out.print(f"device {lane['device']}: {lane['images']} images, {lane['faces']} faces, "
                  f"{lane['faces_per_s'] or 0:.2f} faces/s{lost}", highlight=False, soft_wrap=True)
    if report is not None:
        data = {"gpen_tune": __version__, "settings": asdict(settings), "device": str(pipe.device),
                "weights": pipe.weights_source, "detector": detector_name, "tune": summary["tune"],
                "summary": summary, "images": [j.report() for j in result.jobs]}
        try:
            write_report(report, data)
        except OSError as e:
            err.print(f"[bold red]error:[/] --report {report}: not written ({e.strerror or e})", highlight=False,
                      soft_wrap=True)
            return result.exit_code or 1
    if result.summary.interrupted:
        err.print("[bold red]interrupted:[/] images not processed are listed as not processed; every file "
                  "written is complete")
    return result.exit_code


def _remove_if_empty(folder: Path, created: bool) -> None:
    """A failed validation leaves no empty output folder behind (only one this command created)."""
    if created and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


class _SigintScope:
    """Installs `self._handler` for Ctrl-C inside a `with` block (the previous handler comes back after it)."""

    previous = None

    def _handler(self, signum, frame) -> None:
        raise NotImplementedError

    def __enter__(self):
        try:
            self.previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:                      # not the main thread (e.g. inside a test runner's thread)
            self.previous = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


class _interrupted_while_building(_SigintScope):
    """Ctrl-C while the pipeline is built (model, detector, kernels): exit 130 at once with one line. Nothing is
    written yet, and a KeyboardInterrupt raised there can land inside a Python callback of native code (torch's
    extensions), which aborts the process instead of unwinding it."""

    def __init__(self, output: Path, created: bool):
        self.output, self.created = output, created

    def _handler(self, signum, frame) -> None:
        _remove_if_empty(self.output, self.created)
        err.print("\n[bold red]interrupted[/] while starting: nothing was written")
        os._exit(130)


class _interrupts(_SigintScope):
    """Ctrl-C once: stop taking new images, finish the files being written, summary, exit 130. Twice: exit 130 at
    once (temp files of this run removed first: no partial output, no abort from threads inside native code)."""

    def __init__(self, output: Path):
        self.output = output
        self.count = 0

    def _handler(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            raise KeyboardInterrupt
        from gpen_tune.pipeline.outputs import remove_stale_temp_files  # imported by the run already

        remove_stale_temp_files(self.output, pid=os.getpid())   # images' and videos' temp files of this run
        err.print("\n[bold red]interrupted twice:[/] stopped at once; every file written is complete")
        os._exit(130)
