"""`gpen-tune enhance INPUT... -o OUTDIR`: restore every face of photos, folders and videos (a thin layer over
`gpen_tune.pipeline.api.enhance`: the checks, the report and the run's numbers come from the library)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpen_tune.choices import BG_UPSAMPLERS, DETECTOR_NAMES, DEVICES, TEMPLATES, spelled
from gpen_tune.cli import app
from gpen_tune.cli._console import failure, notice, out, user_errors
from gpen_tune.cli._options import (
    ActCheckpointOpt,
    AmpOpt,
    BackendOpt,
    CheckpointAliasOpt,
    CompileOpt,
    CudaGraphOpt,
    FaceCropOpt,
    FusedOpt,
    LazyDetectorOpt,
    OnednnOpt,
    choice,
    either,
    preset_option,
    tune_config_from_options,
)
from gpen_tune.cli._options import panel_option as _opt  # short: it is on every option line
from gpen_tune.cli._run import RunOptions, run_command
from gpen_tune.extras import MissingPart, require
from gpen_tune.pipeline.conflicts import check_detector_process, check_scale_out, existing_policy
from gpen_tune.video_presets import detect_every_for, encoder_preset_for

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
  gpen-tune enhance albums/ -r -o restored/ --report report.json\n
  gpen-tune enhance clip.mp4 photos/ -o out/ --codec libx265
"""


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
                                    help="Restored share (default 1); not GFPGAN/CodeFormer's -w.")] = 1.0,
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
                                             parser=choice(BG_UPSAMPLERS), help=f"Upscale the photo first: "
                                             f"{spelled(BG_UPSAMPLERS)} (the [upscale] extra).")] = None,
    upscale: Annotated[int, _opt("--upscale", panel=BG_PANEL, metavar="2|4", show_default=False,
                                 help="Background upscale factor (default 2).")] = 2,
    bg_weights: Annotated[str | None, _opt("--bg-weights", panel=BG_PANEL, metavar="PATH",
                                           help="Upscaler weights file (for offline use).")] = None,
    tile: Annotated[int, _opt("--tile", panel=BG_PANEL, metavar="PX", show_default=False,
                              help="Upscale in overlapping tiles of PX (default 0: whole photo).")] = 0,
    model: Annotated[str, _opt("--model", panel=MODEL_PANEL, show_default=False,
                               help="A model of `gpen-tune weights list` (default GPEN-BFR-512).")] = "GPEN-BFR-512",
    weights: Annotated[str | None, _opt("--weights", panel=MODEL_PANEL, metavar="PATH|NAME",
                                        help="PATH, registry name or 'synthetic' (a dry run); default: the cached "
                                        "official file.")] = None,
    device: Annotated[str, _opt("--device", panel=MODEL_PANEL, show_default=False, parser=choice(DEVICES),
                                help=f"{spelled(DEVICES, 'auto')}; auto = cuda > mps > cpu.")] = "auto",
    detector: Annotated[str, _opt("--detector", panel=DETECT_PANEL, metavar="NAME", show_default=False,
                                  parser=choice(DETECTOR_NAMES), help=f"{spelled(DETECTOR_NAMES, 'auto')}.")]
    = "auto",
    detector_weights: Annotated[str | None, _opt("--detector-weights", panel=DETECT_PANEL, metavar="PATH",
                                                 help="RetinaFace weights file or URL.")] = None,
    det_size: Annotated[int | None, _opt("--det-size", panel=DETECT_PANEL, show_default=False, metavar="PX",
                                         help="Long side of the detection copy (default 1024; 0 = native).")]
    = None,
    det_threshold: Annotated[float | None, _opt("--det-threshold", panel=DETECT_PANEL, metavar="0..1",
                                                help="Minimum face score (default 0.9).")] = None,
    template: Annotated[str, _opt("--template", panel=DETECT_PANEL, show_default=False, parser=choice(TEMPLATES),
                                  help=f"Alignment: {spelled(TEMPLATES, 'gpen')}; gpen is upstream's, ffhq GFPGAN's.")]
    = "gpen",
    batch_size: Annotated[int | None, _opt("--batch-size", panel=PERF_PANEL, show_default=False, metavar="N",
                                           help="Faces per generator call (default: 32 on CUDA, 8 elsewhere).")]
    = None,
    workers: Annotated[int | None, _opt("--workers", panel=PERF_PANEL, show_default=False, metavar="N",
                                        help="Paste/encode threads (default: half the cores, 1..8).")] = None,
    serial: Annotated[bool | None, _opt("--serial/--no-serial", panel=PERF_PANEL, show_default=False,
                                        help="Serial or pipelined (default serial for one photo, <= 2 CPU "
                                             "cores).")]
    = None,
    detector_processes: Annotated[int, _opt("--detector-processes", panel=PERF_PANEL, metavar="N",
                                            show_default=False,
                                            help="Detect in N processes (GPU folders, videos; default 0: a thread).")]
    = 0,
    detector_process: Annotated[bool, typer.Option("--detector-process", hidden=True,
                                                   help="The same as --detector-processes 1.")] = False,
    codec: Annotated[str | None, _opt("--codec", panel=VIDEO_PANEL, metavar="NAME", help="Video encoder, e.g. "
                                      "libx265, h264_nvenc (default: the input's family).")] = None,
    crf: Annotated[float | None, _opt("--crf", panel=VIDEO_PANEL, metavar="Q", help="Video quality, lower is "
                                      "better (default: visually lossless for the codec).")] = None,
    smooth: Annotated[bool, _opt("--smooth/--no-smooth", panel=VIDEO_PANEL, show_default=False,
                                 help="Track faces and smooth their landmarks across frames (default: on).")] = True,
    video_preset: Annotated[str | None, _opt("--video-preset", panel=VIDEO_PANEL, metavar="NAME",
                                             show_default=False, help="x264/x265 speed preset (default medium; "
                                             "veryfast with --preset speed).")] = None,
    detect_every: Annotated[int | None, _opt("--detect-every", panel=VIDEO_PANEL, metavar="N", show_default=False,
                                             help="Full face detection every Nth frame, the rest follow its faces "
                                             "(default 1).")] = None,
    devices: Annotated[str | None, _opt("--devices", panel=SCALE_PANEL, show_default=False, metavar="LIST",
                                        help="Run on several GPUs of this host: all, or numbers such as 0,1,3.")]
    = None,
    ray: Annotated[bool, _opt("--ray", panel=SCALE_PANEL, help="Run on a Ray cluster (a local one without "
                              "--ray-address).")] = False,
    ray_address: Annotated[str | None, _opt("--ray-address", panel=SCALE_PANEL, show_default=False,
                                            metavar="ADDR", help="The Ray cluster to join, e.g. auto or "
                                            "ray://head:10001.")] = None,
    preset: Annotated[str, preset_option("auto")] = "auto",
    lazy_detector: LazyDetectorOpt = None,
    compile: CompileOpt = None,
    amp: AmpOpt = None,
    act_checkpoint: ActCheckpointOpt = None,
    checkpoint: CheckpointAliasOpt = None,
    face_crop: FaceCropOpt = None,
    cuda_graph: CudaGraphOpt = None,
    fused: FusedOpt = None,
    backend: BackendOpt = None,
    onednn: OnednnOpt = None,
) -> None:
    """Restore every face in photos and videos: detect, align, restore in batches, paste back seamlessly."""
    # Long only for its Typer signature (one annotated parameter per flag); the body checks and hands over. Every
    # check comes before any work: the light ones (no torch) first, so that they answer at once.
    names = list(inputs or []) + list(input_ or [])
    to_ray = ray or ray_address is not None
    try:
        existing = existing_policy(overwrite, skip_existing)
        encoder_speed = encoder_preset_for(video_preset, preset)
        key_every = detect_every_for(detect_every)
        if detector_processes < 0:
            raise ValueError(f"--detector-processes {detector_processes}: use 0 (a thread) or more")
        check_scale_out(devices, to_ray)
        for needed, part in ((to_ray, "ray"), (bg_upsampler is not None, "spandrel")):
            if needed:
                require(part)
    except (ValueError, MissingPart) as e:
        raise failure(e) from None
    settings, tune, origin = _settings_and_tune(
        names, recursive=recursive, preset=preset, switches=(lazy_detector, compile, amp,
                                                             either(act_checkpoint, checkpoint), face_crop,
                                                             cuda_graph, fused, backend, onednn),
        device=device, to_ray=to_ray, checks=dict(pattern=name_pattern, suffix=suffix, ext=ext, codec=codec,
                                                  report=report, existing=existing),
        model=model, weights=weights, template=template, detector=detector, detector_weights=detector_weights,
        det_size=det_size, det_threshold=det_threshold, strength=strength, aligned=aligned,
        only_center_face=only_center_face or only_center_face_alias, parse_mask=parse_mask,
        parse_weights=parse_weights, batch_size=batch_size,
        detector_process=detector_process or detector_processes > 0,
        detector_processes=max(1, detector_processes),
        bg_upsampler=bg_upsampler, upscale=upscale, bg_weights=bg_weights, tile=tile, png_level=png_level)
    build, run = _executor(devices, to_ray, ray_address, output, settings)
    out.print(f"optimizations: {origin}", highlight=False, soft_wrap=True)
    from gpen_tune.pipeline.api import VideoOptions  # heavy: torch (fast --help)
    from gpen_tune.pipeline.scheduler import SchedulerConfig  # heavy: torch (fast --help)
    options = RunOptions(recursive=recursive, ext=ext, suffix=suffix, name_pattern=name_pattern, existing=existing,
                         save_faces=save_faces, save_comparison=save_comparison, save_mask=save_mask,
                         serial=serial, config=SchedulerConfig(workers=workers),
                         video=VideoOptions(codec=codec, crf=crf, smooth=smooth, encoder_preset=encoder_speed,
                                            detect_every=key_every))
    raise typer.Exit(run_command(names, Path(output), settings, tune, options, report=report, build=build, run=run))


def _settings_and_tune(names: list[str], *, recursive: bool, preset: str, switches: tuple, device: str,
                       to_ray: bool, checks: dict[str, Any], **fields: Any) -> tuple[Any, Any, str]:
    """(EnhanceSettings, TuneConfig, the line saying where the switches came from), every choice checked before
    any work: names and formats, the inputs (they exist), the report path, the optional parts the inputs need, the
    weights (they exist), then the device (its notice) and the preset."""
    from gpen_tune.model.configs import model_info  # heavy: torch (fast --help)
    from gpen_tune.pipeline.api import collect_existing_inputs, require_parts  # heavy: torch (fast --help)
    from gpen_tune.pipeline.outputs import check_ext, check_pattern, check_suffix  # heavy: cv2 (fast --help)
    from gpen_tune.pipeline.report import check_report_path  # heavy: torch (fast --help)
    from gpen_tune.pipeline.settings import (  # heavy: torch (fast --help)
        EnhanceSettings,
        check_weights,
        detection_size,
        resolve_device,
    )

    try:
        model_info(fields["model"])
        check_pattern(checks["pattern"])
        check_suffix(checks["suffix"])
        check_ext(checks["ext"])
        if checks["codec"] is not None:
            require("av")
            from gpen_tune.video.encoders import check_encoder  # heavy: av (only with --codec)

            check_encoder(checks["codec"])
        found = collect_existing_inputs(names, recursive)
        if checks["report"] is not None and check_report_path(checks["report"], checks["existing"]):
            flag = "--overwrite" if checks["existing"] == "overwrite" else "--skip-existing: a resumed batch"
            notice(f"--report {checks['report']} exists: replaced at the end ({flag})")
        settings = EnhanceSettings(**{**fields, "det_size": None})
        require_parts(settings, found)
        check_weights(settings)
        if to_ray and device != "cpu":
            dev = "cuda"                                 # the restore actors' device (GPUs of the cluster)
        else:
            dev = resolve_device(device, notice, model=settings.model).type
        tune, origin = tune_config_from_options(preset, *switches, device=dev)
        settings.device = dev if device == "auto" else device
        settings.det_size = detection_size(fields["det_size"], tune.face_crop)
        check_detector_process(settings.detector_process, tune.lazy_detector)
    except user_errors() as e:
        raise failure(e) from None
    return settings, tune, origin


def _executor(devices: str | None, to_ray: bool, ray_address: str | None, output: str,
              settings: Any) -> tuple[Any, Any]:
    """(build, run) for run_command: None, None for one pipeline here; a device pool for --devices; Ray actors."""
    if devices is not None:
        from gpen_tune.cli._scale import device_pool_builder  # heavy: torch (fast --help)

        try:
            return device_pool_builder(devices), None
        except user_errors() as e:
            raise failure(e) from None
    if to_ray:
        from gpen_tune.cli._scale import ray_builder, ray_runner  # optional: ray (the [ray] extra)

        return ray_builder(ray_address, 0 if settings.device == "cpu" else 1), ray_runner(output)
    return None, None
