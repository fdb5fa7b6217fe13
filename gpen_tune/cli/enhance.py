"""`gpen-tune enhance INPUT... -o OUTDIR`: restore every face of photos and folders (thin layer over
`gpen_tune.face.pipeline`)."""

from __future__ import annotations

import glob
import json
import os
import tempfile
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gpen_tune.cli import app
from gpen_tune.cli._console import err, fail, notice, out
from gpen_tune.cli._options import (
    AmpOpt,
    CheckpointOpt,
    CompileOpt,
    CudaGraphOpt,
    FaceCropOpt,
    FusedOpt,
    LazyDetectorOpt,
    PresetOpt,
    tune_config_from_options,
)
from gpen_tune.restore.buckets import default_batch_size

IO_PANEL = "Inputs and outputs"
FACE_PANEL = "Faces"
MODEL_PANEL = "Model and device"
DETECT_PANEL = "Detection and alignment"

EXAMPLES = """
Examples:\n
  gpen-tune enhance photo.jpg -o out/\n
  gpen-tune enhance albums/ -r -o restored/ --model GPEN-BFR-512 --batch-size 16 --report report.json\n
  gpen-tune enhance 'scans/*.png' -o out/ --strength 0.7 --ext jpg --suffix _gpen
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


def collect_inputs(inputs: list[str], recursive: bool) -> tuple[list[tuple[Path, str]], list[str]]:
    """(path, output stem) for every image named by files, folders and globs; plus one error line per miss.

    Folder inputs keep their sub-folder layout in the stem ("sub/name") so equal names do not collide.
    """
    from gpen_tune.imageio import INPUT_EXTENSIONS

    found: list[tuple[Path, str]] = []
    missing: list[str] = []

    def is_image(p: Path) -> bool:
        return p.is_file() and p.suffix.lower().lstrip(".") in INPUT_EXTENSIONS

    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            walk = path.rglob("*") if recursive else path.glob("*")
            files = sorted(p for p in walk if is_image(p) and not p.name.startswith("."))
            if not files:
                missing.append(f"{item}: folder has no jpg/png/webp/bmp/tiff images"
                               + ("" if recursive else " (use --recursive for sub-folders)"))
            found += [(p, p.relative_to(path).with_suffix("").as_posix()) for p in files]
        elif path.exists():
            found.append((path, path.stem))
        elif glob.has_magic(item):
            files = sorted(Path(p) for p in glob.glob(os.path.expanduser(item), recursive=recursive))
            files = [p for p in files if is_image(p)]
            if not files:
                missing.append(f"{item}: no image matches this pattern")
            found += [(p, p.stem) for p in files]
        else:
            missing.append(f"{item}: no such file or folder")
    return _dedupe(found), missing


def _dedupe(found: list[tuple[Path, str]]) -> list[tuple[Path, str]]:
    seen_paths: set[Path] = set()
    seen_stems: dict[str, int] = {}
    result = []
    for path, stem in found:
        key = path.resolve()
        if key in seen_paths:
            continue
        seen_paths.add(key)
        n = seen_stems.get(stem, 0)
        seen_stems[stem] = n + 1
        result.append((path, stem if n == 0 else f"{stem}_{n}"))
    return result


def check_output_dir(outdir: Path) -> None:
    """Create OUTDIR or explain why it cannot be used, before any work is done."""
    if outdir.exists() and not outdir.is_dir():
        raise fail(f"output {outdir} is a file, not a folder: pass a folder with -o")
    try:
        outdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=outdir, prefix=".gpen-tune-write-test-"):
            pass
    except OSError as e:
        raise fail(f"output folder {outdir} is not writable ({e.strerror or e}): choose another -o") from None


def _rate_columns():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]enhance[/]"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[ips]:.2f} img/s  {task.fields[fps]:.2f} faces/s"),
        TimeElapsedColumn(), TextColumn("{task.fields[current]}"),
        console=err, transient=False,
    )


@app.command(epilog=EXAMPLES)
def enhance(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns ('photos/*.jpg').",
                                                show_default=False)],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output folder (created if missing).",
                                         rich_help_panel=IO_PANEL)],
    recursive: Annotated[bool, typer.Option("-r", "--recursive", help="Descend into sub-folders.",
                                            rich_help_panel=IO_PANEL)] = False,
    ext: Annotated[str | None, typer.Option(help="Output format: jpg, png, webp, bmp, tiff (default: as input).",
                                            rich_help_panel=IO_PANEL)] = None,
    suffix: Annotated[str, typer.Option(help="Added to every output name.", rich_help_panel=IO_PANEL)] = "",
    name_pattern: Annotated[str, typer.Option(help="Output file name; fields {name}, {suffix}, {ext}.",
                                              rich_help_panel=IO_PANEL)] = "{name}{suffix}.{ext}",
    report: Annotated[Path | None, typer.Option(help="Write a JSON report: per image status, faces, timings.",
                                                rich_help_panel=IO_PANEL)] = None,
    save_faces: Annotated[bool, typer.Option(
        "--save-faces", help="Also write each aligned crop next to its restoration (OUTDIR/faces/).",
        rich_help_panel=IO_PANEL)] = False,
    save_comparison: Annotated[bool, typer.Option(
        "--save-comparison", help="Also write input | output side by side (OUTDIR/comparisons/).",
        rich_help_panel=IO_PANEL)] = False,
    strength: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="Blend of restored over original: 0 = input unchanged, 1 = fully restored.",
        rich_help_panel=FACE_PANEL)] = 1.0,
    aligned: Annotated[bool, typer.Option(
        "--aligned", help="Inputs are already aligned face crops: no detection, no paste.",
        rich_help_panel=FACE_PANEL)] = False,
    only_center_face: Annotated[bool, typer.Option(
        "--only-center-face", help="Restore only the face closest to the image centre.",
        rich_help_panel=FACE_PANEL)] = False,
    parse_mask: Annotated[bool, typer.Option(
        "--parse-mask", help="Paste through a face-parsing mask (ParseNet, downloaded once; costs more than "
        "GPEN-512 per face).", rich_help_panel=FACE_PANEL)] = False,
    model: Annotated[str, typer.Option(help="GPEN model: GPEN-BFR-256, -512, -1024, -2048.",
                                       rich_help_panel=MODEL_PANEL)] = "GPEN-BFR-512",
    weights: Annotated[str | None, typer.Option(help="Weights: a .pth path, a registry name, or 'synthetic' "
                                                "(default: the cached file of --model, else synthetic).",
                                                rich_help_panel=MODEL_PANEL)] = None,
    device: Annotated[DeviceChoice, typer.Option(help="auto = cuda > mps > cpu.",
                                                 rich_help_panel=MODEL_PANEL)] = DeviceChoice.auto,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Faces per generator call (across images); "
                                                   "default 32 on CUDA, 8 elsewhere.",
                                                   rich_help_panel=MODEL_PANEL, show_default=False)] = None,
    detector: Annotated[DetectorChoice, typer.Option(help="auto: RetinaFace-R50 when its weights are cached or "
                                                     "downloadable, else the offline MTCNN.",
                                                     rich_help_panel=DETECT_PANEL)] = DetectorChoice.auto,
    detector_weights: Annotated[str | None, typer.Option(help="RetinaFace weights file or URL (upstream's "
                                                         "RetinaFace-R50.pth works).",
                                                         rich_help_panel=DETECT_PANEL)] = None,
    det_size: Annotated[int, typer.Option(min=0, help="Detect on a copy with this long side (0 = native size).",
                                          rich_help_panel=DETECT_PANEL)] = 1024,
    det_threshold: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Minimum face score "
                                                        "(default 0.9).", rich_help_panel=DETECT_PANEL)] = None,
    template: Annotated[TemplateChoice, typer.Option(help="Alignment template: gpen (upstream GPEN) or ffhq "
                                                     "(GFPGAN/facefusion).",
                                                     rich_help_panel=DETECT_PANEL)] = TemplateChoice.gpen,
    workers: Annotated[int | None, typer.Option(min=1, help="Paste/encode threads of the pipelined runner "
                                                "(default: half the cores, 1..8); decode/align threads are 6x "
                                                "that on CUDA (at most 48, they mostly wait for the one detector "
                                                "thread), the same number elsewhere.",
                                                rich_help_panel=MODEL_PANEL)] = None,
    serial: Annotated[bool, typer.Option("--serial", help="Process images one step at a time (the serial path) "
                                         "instead of the pipelined runner used for several inputs.",
                                         rich_help_panel=MODEL_PANEL)] = False,
    detector_process: Annotated[bool, typer.Option(
        "--detector-process", help="Run the face detector in a process of its own (its own GIL) for big folders: "
        "H200, 4,096 photos: 693 vs 625 faces/s, the GPU busy 81 vs 66 % of the run; its start costs ~10 s. "
        "Not with --lazy-detector; ignored by --serial and single images.",
        rich_help_panel=DETECT_PANEL)] = False,
    preset: PresetOpt = None,
    lazy_detector: LazyDetectorOpt = None,
    compile: CompileOpt = None,
    amp: AmpOpt = None,
    checkpoint: CheckpointOpt = None,
    face_crop: FaceCropOpt = None,
    cuda_graph: CudaGraphOpt = None,
    fused: FusedOpt = None,
) -> None:
    """Restore every face in photos: detect, align, restore in batches, paste back seamlessly."""
    from gpen_tune.face.pipeline import EnhanceSettings, resolve_device

    try:
        naming_probe = name_pattern.format(name="x", suffix=suffix, ext="png")
    except (KeyError, IndexError, ValueError) as e:
        fields = "{name}, {suffix}, {ext}"
        raise fail(f"--name-pattern {name_pattern!r} is invalid ({e}); fields are {fields}") from None
    if "/" in naming_probe or "\\" in naming_probe:
        raise fail("--name-pattern must not contain folders")
    if ext is not None:
        from gpen_tune.imageio import EXT_TO_FORMAT

        if ext.lower().lstrip(".") not in EXT_TO_FORMAT:
            raise fail(f"--ext {ext}: unsupported; use one of {', '.join(EXT_TO_FORMAT)}")
    check_output_dir(output)
    files, missing = collect_inputs(inputs, recursive)
    for line in missing:
        err.print(f"[bold red]failed:[/] {line}", highlight=False, soft_wrap=True)
    if not files:
        raise fail("no input image found")

    try:
        dev = resolve_device(device.value, notice)
        cfg, line = tune_config_from_options(preset, lazy_detector, compile, amp, checkpoint, face_crop, cuda_graph,
                                             fused, device=dev.type)
        settings = EnhanceSettings(
            model=model, weights=weights, template=template.value, detector=detector.value,
            detector_weights=detector_weights, det_size=det_size or None, det_threshold=det_threshold,
            strength=strength, only_center_face=only_center_face, aligned=aligned, parse_mask=parse_mask,
            batch_size=batch_size or default_batch_size(dev), device=str(dev),
        )
    except (ValueError, RuntimeError) as e:
        raise fail(str(e)) from None
    out.print(f"optimizations: {line}", highlight=False, soft_wrap=True)
    code = run_enhance(files, output, settings, ext=ext, suffix=suffix, name_pattern=name_pattern, report=report,
                       save_faces=save_faces, save_comparison=save_comparison, n_missing=len(missing),
                       workers=workers, serial=serial, tune=cfg, detector_process=detector_process)
    raise typer.Exit(code)


def build_enhancer(settings, tune=None):
    """The Enhancer behind the tune switches (gpen_tune/restore/wiring.py): (enhancer, restorer or None).

    `tune` None keeps the plain model forward (library callers that never asked for switches).
    """
    from gpen_tune.face.pipeline import Enhancer, resolve_device, resolve_weights

    if tune is None:
        return Enhancer(settings, notify=notice), None
    from gpen_tune.load import load_model
    from gpen_tune.restore.wiring import tune_pipeline

    device = resolve_device(settings.device, notice)
    model = load_model(resolve_weights(settings, notice), model=settings.model, device=device)
    settings, restore, detector = tune_pipeline(settings, tune, model, device, notify=notice)
    for msg in restore.fallbacks:
        notice(msg)
    return Enhancer(settings, model=restore.model, restore=restore, detector=detector, notify=notice), restore


def run_enhance(files, output, settings, *, ext, suffix, name_pattern, report, save_faces, save_comparison,
                n_missing=0, workers=None, serial=False, tune=None, detector_process=False) -> int:
    """Build the enhancer, run every image with a progress bar, print the summary; returns the exit code.

    `tune`: the TuneConfig of the optimization switches (None = the plain model, no switch applied).
    """
    from gpen_tune.face.detect import DetectorError
    from gpen_tune.face.pipeline import OutputNaming
    from gpen_tune.weights.cache import WeightsNotFoundError
    from gpen_tune.weights.checkpoint import CheckpointError

    inputs_resolved = {p.resolve() for p, _ in files}
    t0 = time.perf_counter()
    try:
        enhancer, restorer = build_enhancer(settings, tune)
        settings = enhancer.settings
        # build the detector (and parser) now: a missing weights file fails before any image
        detector_name = None if settings.aligned else enhancer.detector.name
        if settings.parse_mask and not settings.aligned:
            _ = enhancer.parser
    except (ValueError, KeyError, RuntimeError, DetectorError, CheckpointError, WeightsNotFoundError, OSError) as e:
        raise fail(str(e).strip("'\"")) from None
    naming = OutputNaming(output, ext=ext, suffix=suffix, pattern=name_pattern)
    clash = [p for p, stem in files if _would_overwrite(p, stem, naming, inputs_resolved)]
    if clash:
        raise fail(f"output would overwrite the input {clash[0]}: use --suffix or another -o folder")

    totals = {"images": 0, "faces": 0}
    progress = _rate_columns()

    def on_job(job) -> None:
        totals["images"] += 1
        totals["faces"] += len(job.faces) if job.status == "ok" else 0
        if job.status == "error":
            progress.console.print(f"[bold red]failed:[/] {job.error}", highlight=False, soft_wrap=True)
        dt = max(time.perf_counter() - t_run, 1e-9)
        progress.update(task, advance=1, ips=totals["images"] / dt, fps=totals["faces"] / dt,
                        current=Path(job.source).name)

    with progress:
        task = progress.add_task("enhance", total=len(files), ips=0.0, fps=0.0, current="")
        t_run = time.perf_counter()
        try:
            from gpen_tune.throughput.api import run_jobs  # several inputs: pipelined runner (issue 7)

            jobs = run_jobs(files, naming, enhancer, on_job=on_job, save_faces=save_faces,
                            save_comparison=save_comparison, workers=workers, serial=serial,
                            detector_process=detector_process)
        except ValueError as e:           # e.g. --detector-process with --lazy-detector
            raise fail(str(e)) from None
        finally:
            enhancer.close()
    wall = time.perf_counter() - t0
    summary = _summary(jobs, wall, n_missing)
    summary["tune"] = _tune_summary(tune, restorer)
    _print_summary(summary, jobs)
    if report is not None:
        _write_report(report, settings, enhancer, detector_name, jobs, summary)
    if jobs.interrupted:
        err.print("[bold red]interrupted:[/] images not processed are counted as failed; no partial file written")
        return 130
    return 1 if summary["failed"] else 0


def _would_overwrite(path: Path, stem: str, naming, inputs_resolved) -> bool:
    from gpen_tune.imageio import EXT_TO_FORMAT

    ext = naming.ext or path.suffix.lstrip(".")
    if ext.lower() not in EXT_TO_FORMAT:
        return False
    target = naming.outdir / naming.pattern.format(name=stem, suffix=naming.suffix, ext=ext)
    return target.resolve() in inputs_resolved


def _summary(jobs, wall: float, n_missing: int) -> dict:
    from gpen_tune.face.pipeline import STAGES

    ok = [j for j in jobs if j.status == "ok"]
    faces = sum(len(j.faces) for j in ok)
    stage_totals = {s: sum(j.timings.get(s, 0.0) for j in jobs) for s in STAGES}
    stage_means = {s: v / max(len(jobs), 1) for s, v in stage_totals.items()}
    return {
        "images": len(jobs),
        "restored": len(ok),
        "no_face": sum(j.status == "no_face" for j in jobs),
        "failed": sum(j.status == "error" for j in jobs) + n_missing,
        "faces": faces,
        "wall_s": round(wall, 3),
        "images_per_s": round(len(jobs) / wall, 3) if wall else None,
        "faces_per_s": round(faces / wall, 3) if wall else None,
        "mean_stage_s": {k: round(v, 4) for k, v in stage_means.items()},
        "stages": stage_table(stage_totals, len(jobs), faces),
    }


def stage_table(totals: dict[str, float], images: int, faces: int) -> dict[str, dict[str, float | None]]:
    """Per stage: total seconds (summed over images; stages overlap in the pipelined runner), ms per image and
    ms per face."""
    return {k: {"total_s": round(v, 4), "ms_per_image": round(1000 * v / images, 2) if images else None,
                "ms_per_face": round(1000 * v / faces, 2) if faces else None} for k, v in totals.items()}


def _tune_summary(cfg, restorer) -> dict | None:
    """The TuneConfig asked for, what ran, and every restorer fallback (NaN -> fp32, compile -> eager, OOM)."""
    if cfg is None:
        return None
    from dataclasses import asdict

    data = {"requested": asdict(cfg), "describe": cfg.describe(), "effective": None, "fallbacks": [],
            "skipped": {}, "notes": [], "fp32_reruns": 0, "max_batch": None}
    if restorer is not None:
        data.update(effective=asdict(restorer.effective), effective_describe=restorer.effective.describe(),
                    fallbacks=list(restorer.fallbacks),
                    skipped=dict(restorer.skipped), notes=list(restorer.notes), fp32_reruns=restorer.fp32_reruns,
                    max_batch=restorer.max_batch,
                    warmup_s={f"bs{k[0]}": round(v, 3) for k, v in restorer.warmup_seconds.items()})
    return data


def _print_summary(summary: dict, jobs) -> None:
    from rich.table import Table

    table = Table(title="gpen-tune enhance", show_header=True, header_style="bold")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_row("images with faces restored", str(summary["restored"]))
    table.add_row("images without a face (written unchanged)", str(summary["no_face"]))
    table.add_row("failed inputs", f"[red]{summary['failed']}[/]" if summary["failed"] else "0")
    table.add_row("faces restored", str(summary["faces"]))
    table.add_row("wall time", f"{summary['wall_s']:.2f} s")
    table.add_row("images/s · faces/s", f"{summary['images_per_s'] or 0:.2f} · {summary['faces_per_s'] or 0:.2f}")
    tune = summary.get("tune")
    if tune:
        ran = tune.get("effective_describe") or tune["describe"]
        table.add_row("optimizations", ran if ran == tune["describe"] else f"{ran} (asked: {tune['describe']})")
        for msg in tune["fallbacks"]:
            table.add_row("[yellow]fallback[/]", msg)
    out.print(table)
    print_stage_table(summary["stages"])


def print_stage_table(stages: dict[str, dict]) -> None:
    """Per stage: total s, ms per image, ms per face (stages overlap when the pipelined runner is used)."""
    from rich.table import Table

    table = Table(title="per-stage timings", show_header=True, header_style="bold",
                  caption="stage time summed over images (the pipelined runner overlaps stages; wall time above)")
    for col in ("stage", "total s", "ms / image", "ms / face"):
        table.add_column(col, justify="left" if col == "stage" else "right")

    def fmt(v):
        return "-" if v is None else f"{v:.1f}"

    for name, row in stages.items():
        table.add_row(name, f"{row['total_s']:.3f}", fmt(row["ms_per_image"]), fmt(row["ms_per_face"]))
    out.print(table)


def _write_report(path: Path, settings, enhancer, detector_name, jobs, summary) -> None:
    from dataclasses import asdict

    from gpen_tune import __version__

    data = {
        "gpen_tune": __version__,
        "settings": asdict(settings),
        "device": str(enhancer.device),
        "weights": getattr(enhancer.model, "weights_source", None),
        "detector": detector_name,
        "tune": summary.get("tune"),
        "summary": summary,
        "images": [j.report() for j in jobs],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)
