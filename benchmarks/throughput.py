"""End-to-end folder throughput: the serial driver and the pipelined runner on the same folder, in the same run.

Builds a folder of real photos from the bundled test images (scikit-image's astronaut, matplotlib's Grace Hopper):
  copy      the photo as a JPEG (1 face, 512 px)
  crop      one tile of a mosaic (1 face, ~550 px)
  upscale   a photo or a mosaic upscaled x2..x3 (1 or 6 faces, 1280..3300 px: exercises the paste on big frames)
  mosaic    4, 6, 9, 12 or 16 faces at different scales and rotations on one canvas (1100..2200 px)
and repeats them (file copies) up to --images. Then, for the serial path (what `enhance --serial` runs) and for
the threaded scheduler (`gpen_tune.pipeline`), it measures wall time, images/s, faces/s, the GPU busy
fraction (sum of CUDA-event-timed generator calls / wall; also NVML utilisation when pynvml is there), peak GPU
memory (allocated and reserved), peak host RSS, and the pipeline's per-stage timings, and compares the outputs.

    # GPU (~3-5 minutes on an H200 including compile warm-up):
    python benchmarks/throughput.py --model GPEN-BFR-512 --preset speed --images 480 --batch 32 --out benchmarks/results
    # CPU, tiny (tests and a smoke check here):
    python benchmarks/throughput.py --tiny --out /tmp/tp

Writes one JSON file to --out (default benchmarks/results/) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from meters import BusyMeter, Sampler  # noqa: E402
from timing import Stopwatch, bench_device  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.face.detect import init_detector  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.pipeline.api import Pipeline  # noqa: E402
from gpen_tune.pipeline.outputs import OutputNaming  # noqa: E402
from gpen_tune.pipeline.scheduler import SchedulerConfig  # noqa: E402
from gpen_tune.pipeline.settings import EnhanceSettings  # noqa: E402
from gpen_tune.pipeline.sinks import FileSink  # noqa: E402
from gpen_tune.pipeline.sources import FileSource  # noqa: E402
from gpen_tune.restore.restorer import Restorer, build_restorer  # noqa: E402

TARGETS = {"faces_per_s": 1000.0, "speedup_vs_serial": 3.0, "gpu_busy": 0.90}


# ---------------------------------------------------------------------------------------------------- inputs


def _jpeg(path: Path, rgb: np.ndarray) -> None:
    cv2.imwrite(str(path), np.ascontiguousarray(rgb[..., ::-1]), [cv2.IMWRITE_JPEG_QUALITY, 95])


def _upscale(rgb: np.ndarray, k: float) -> np.ndarray:
    return cv2.resize(rgb, None, fx=k, fy=k, interpolation=cv2.INTER_CUBIC)


def unique_images(tiny: bool) -> list[tuple[str, str, np.ndarray]]:
    """(kind, name, RGB) of the distinct photos the folder is made of."""
    astro, grace = samples.astronaut(), samples.grace_hopper()
    m4, tiles4 = samples.mosaic_with_tiles(4, 0)
    if tiny:
        x0, y0, x1, y1 = tiles4[1]
        return [("copy", "astronaut", astro), ("copy", "grace_hopper", grace), ("mosaic", "mosaic4_s0", m4),
                ("crop", "tile1_of_mosaic4", m4[y0:y1, x0:x1])]
    out = [("copy", "astronaut", astro), ("copy", "grace_hopper", grace)]
    for i, (x0, y0, x1, y1) in enumerate(tiles4):
        out.append(("crop", f"tile{i}_of_mosaic4", m4[y0:y1, x0:x1]))
    out += [("upscale", "astronaut_x3", _upscale(astro, 3.0)), ("upscale", "grace_hopper_x2.5", _upscale(grace, 2.5)),
            ("upscale", "mosaic6_x1.5", _upscale(samples.mosaic(6, 1), 1.5))]
    for n, seed in ((4, 2), (6, 3), (9, 4), (12, 5), (16, 6), (9, 7), (6, 8)):
        out.append(("mosaic", f"mosaic{n}_s{seed}", samples.mosaic(n, seed)))
    return out


def build_folder(folder: Path, n_images: int, tiny: bool) -> dict:
    """Write the distinct photos once and copy them round-robin up to n_images; returns the composition."""
    folder.mkdir(parents=True, exist_ok=True)
    uniq = unique_images(tiny)
    files = []
    for kind, name, rgb in uniq:
        p = folder / f"_src_{name}.jpg"
        _jpeg(p, rgb)
        files.append((kind, name, p, rgb.shape[1], rgb.shape[0]))
    kinds: dict[str, int] = {}
    for i in range(n_images):
        kind, name, p, _, _ = files[i % len(files)]
        shutil.copyfile(p, folder / f"{i:05d}_{kind}_{name}.jpg")
        kinds[kind] = kinds.get(kind, 0) + 1
    for _, _, p, _, _ in files:
        p.unlink()
    return {
        "images": n_images,
        "per_kind": kinds,
        "distinct": [{"kind": k, "name": n, "width": w, "height": h} for k, n, _, w, h in files],
        "sources": "scikit-image data.astronaut() and matplotlib grace_hopper.jpg; copies, mosaic tiles (crops), "
                   "x1.5-x3 upscales, mosaics of 4-16 faces (gpen_tune.face.samples); JPEG q95",
    }


# ---------------------------------------------------------------------------------------------------- runs


def measure(name: str, run, meter: BusyMeter, device: torch.device) -> dict:
    """Run one path and return its numbers."""
    meter.clear()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with Sampler(device) as sampler, Stopwatch(device) as sw:
        summary = run()
    wall = sw.seconds
    gen = meter.seconds()
    faces = summary.faces
    out = {
        "path": name,
        "wall_s": round(wall, 3),
        "images_ok": summary.ok,
        "images_failed": summary.failed,
        "faces": faces,
        "images_per_s": round(summary.ok / wall, 2),
        "faces_per_s": round(faces / wall, 2),
        "generator_s": round(gen, 3),
        "generator_calls": meter.calls,
        "gpu_busy": round(gen / wall, 3) if device.type == "cuda" else None,
        "generator_timeline": meter.timeline(wall) if device.type == "cuda" else None,
        "nvml_util_mean": round(float(np.mean(sampler.util)), 3) if sampler.util else None,
        "peak_host_rss_mib": round(sampler.rss_peak / 2**20, 1),
        "process_cpu_cores": round(sampler.process_cpu_s / wall, 2),      # mean busy cores of this process
        "cpu_by_thread": sampler.cpu_by_thread(),
        "stages": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in summary.stages.items()},
        "image_timings_s": image_timings(summary),
    }
    if device.type == "cuda":
        out["peak_gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        out["peak_gpu_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
    return out, summary


def image_timings(summary) -> dict:
    """Seconds per step summed over the run's images (each image's job timings: decode, detect (its share of the
    detector call, waiting included), align (crops cut), restore (share of the batch), paste, encode ...)."""
    total: dict[str, float] = {}
    for job in summary.results:
        for k, v in job.timings.items():
            total[k] = total.get(k, 0.0) + v
    return {k: round(v, 3) for k, v in sorted(total.items())}


def limiting_stage(res: dict) -> dict:
    """Busy fraction of each pipeline stage over the wall time: the highest one limits."""
    st, wall = res["stages"], res["wall_s"]
    workers = st.get("workers", 1)
    share = {
        "prepare (decode+detect+align), per worker": st.get("prepare_s", 0.0) / (st.get("prepare_workers", workers)
                                                                                   * wall),
        "generator (GPU)": res["generator_s"] / wall,
        "finish (paste+encode+write), per worker": st.get("finish_s", 0.0) / (workers * wall),
        "gpu stage waiting for prepared faces": st.get("gpu_wait_input_s", 0.0) / wall,
        "gpu stage blocked by finish queue": st.get("gpu_wait_output_s", 0.0) / wall,
    }
    busy = {k: v for k, v in share.items() if not k.startswith("gpu stage")}
    return {"busy_fraction": {k: round(v, 3) for k, v in share.items()}, "limiting": max(busy, key=busy.get)}


def compare_outputs(a: list, b: list, limit: int = 40) -> dict:
    """Max / mean absolute difference of decoded outputs, serial vs pipeline (first `limit` pairs; the serial run
    may cover only the first photos of the folder)."""
    diffs = []
    n = min(len(a), len(b), limit)
    for ra, rb in zip(a[:n], b[:n], strict=True):
        if ra.output is None or rb.output is None:
            continue
        x, y = cv2.imread(str(ra.output)), cv2.imread(str(rb.output))
        if x is None or y is None or x.shape != y.shape:
            diffs.append((255, 255.0))
            continue
        d = np.abs(x.astype(np.int16) - y.astype(np.int16))
        diffs.append((int(d.max()), float(d.mean())))
    if not diffs:
        return {"compared": 0}
    return {"compared": len(diffs), "max_abs": max(m for m, _ in diffs),
            "mean_abs": round(float(np.mean([m for _, m in diffs])), 4)}


def environment(device: torch.device) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "opencv": cv2.__version__,
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                           timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001
        env["git_commit"] = None
    from gpen_tune import __version__

    env["gpen_tune"] = __version__
    return env


def build_restore(model, preset: str, device: torch.device, batch: int):
    """The Restorer of a preset ('none' = plain fp32 eager), starting limit `batch`."""
    if preset == "none":
        return Restorer(model, device=device, size=model.size, max_batch=batch), {"preset": "none"}
    from dataclasses import asdict

    from gpen_tune.tune import PRESETS

    restorer = build_restorer(model, PRESETS[preset], device=device, max_batch=batch)
    return restorer, {"preset": preset, "requested": asdict(restorer.cfg), "effective": asdict(restorer.effective),
                      "fallbacks": restorer.fallbacks}


def metered_pipeline(model_name: str, weights: str, preset: str, device: torch.device, batch: int,
                     detector_name: str = "mtcnn", parse_mask: bool | None = None, parse_weights: str | None = None):
    """(pipeline, detector, restorer, meter, tune info): the generator of a preset behind a BusyMeter and one
    detector, as the video and group-photo benchmarks run them; the caller closes pipeline and detector."""
    model = load_model(weights, model=model_name, device=device)
    restorer, tune_info = build_restore(model, preset, device, batch)
    meter = BusyMeter(restorer.forward)
    restorer.forward = meter
    settings = EnhanceSettings(model=model_name, weights=weights, detector=detector_name, device=device.type,
                               batch_size=batch, parse_mask=parse_mask, parse_weights=parse_weights)
    detector = init_detector(detector_name, device=device, det_size=settings.det_size)
    pipe = Pipeline(settings, restorer.cfg, restorer=restorer, detector=detector)
    return pipe, detector, restorer, meter, tune_info


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke mode: GPEN-BFR-256 synthetic, 4 images")
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--weights", default="synthetic", help="synthetic (timing does not depend on weights) or a path")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--preset", default="speed", help="tune preset (speed | balanced | low-memory) or none")
    ap.add_argument("--images", type=int, default=None, help="folder size (default 480 on CUDA, 4 with --tiny)")
    ap.add_argument("--batch", type=int, default=None, help="faces per generator call (default 32 on CUDA, else 4)")
    ap.add_argument("--workers", type=int, default=None, help="threads per CPU stage (default: half the cores)")
    ap.add_argument("--prepare-workers", type=int, default=None,
                    help="decode/detect/align threads (default: 3x workers up to 32 on CUDA)")
    ap.add_argument("--max-wait-ms", type=float, default=5.0)
    ap.add_argument("--paste", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--detect-batch", type=int, default=1, help="images per detector call in a prepare worker")
    ap.add_argument("--detector", default="mtcnn", help="mtcnn works offline; retinaface needs cached weights")
    ap.add_argument("--det-size", type=int, default=1024, help="long side the detector sees (0 = native)")
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--serial-images", type=int, default=None, metavar="N",
                    help="time the serial path on the first N photos only (the folder repeats its 16 distinct "
                         "photos, so N a multiple of 16 has the same mix); speedup from faces/s")
    ap.add_argument("--detector-process", action="store_true",
                    help="the pipeline runs its detector in a process of its own (enhance --detector-process); "
                         "the process starts in the untimed warm-up")
    ap.add_argument("--ext", default=None, choices=("png", "jpg"),
                    help="output format (default: as the input, JPEG): png compares serial and pipeline outputs "
                         "without JPEG's re-quantisation, which turns a one-level pixel difference into several")
    ap.add_argument("--ab-detector-process", action="store_true",
                    help="A/B/A in the same run: the detector in a process of its own (own GIL, own CUDA context)")
    ap.add_argument("--ab-paste-torch", action="store_true",
                    help="A/B/A in the same run: the device paste and crop through their PyTorch twins, not Triton")
    ap.add_argument("--ab-cut-on-cpu", action="store_true",
                    help="A/B/A in the same run: every face cut on the CPU and uploaded by the GPU stage")
    ap.add_argument("--ab-paste", default=None, choices=("auto", "cpu", "gpu"),
                    help="A/B/A in the same run: the pipeline with this --paste instead")
    ap.add_argument("--no-warm-run", dest="warm_run", action="store_false",
                    help="with an --ab-* flag: skip the untimed full pipeline run before the timed A/B/A runs")
    ap.add_argument("--workdir", type=Path, default=None, help="where the folders go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)

    if args.tiny:
        args.model, args.weights = "GPEN-BFR-256", "synthetic"
        args.device = "cpu" if args.device == "auto" else args.device
        args.preset = "none" if args.preset == "speed" else args.preset
        args.images = args.images or 4
    device = bench_device(args.device)
    args.images = args.images or (480 if device.type == "cuda" else 8)
    batch = args.batch or (32 if device.type == "cuda" else 4)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    whole = Stopwatch().start()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpen-throughput-"))
    folder = work / "in"
    print(f"building {args.images} images in {folder} ...", flush=True)
    with Stopwatch() as build:
        composition = build_folder(folder, args.images, args.tiny)
    composition["build_s"] = round(build.seconds, 2)

    torch.backends.cudnn.benchmark = False
    model = load_model(args.weights, model=args.model, device=device)
    restorer, tune_info = build_restore(model, args.preset, device, batch)
    meter = BusyMeter(restorer.forward)
    restorer.forward = meter                # CUDA events around every generator call
    settings = EnhanceSettings(model=args.model, weights=args.weights, detector=args.detector, device=device.type,
                               batch_size=batch, det_size=args.det_size or None, paste=args.paste,
                               detector_process=args.detector_process)
    # one detector for every pipeline of the run (each A/B pipeline serves it its own way)
    detector = init_detector(args.detector, device=device, det_size=settings.det_size)
    config = SchedulerConfig(workers=args.workers, prepare_workers=args.prepare_workers,
                             max_wait_ms=args.max_wait_ms, detect_batch=args.detect_batch)

    def make(**changes) -> Pipeline:
        s = replace(settings, **{k: v for k, v in changes.items() if k in ("paste", "detector_process")})
        return Pipeline(s, restorer.cfg, restorer=restorer, detector=detector,
                        paste_impl=changes.get("paste_impl", "auto"), cut_on_device=changes.get("cut_on_device", True))

    pipelines = {"default": make()}

    def run(pipe: Pipeline, inputs, out: str, serial: bool = False):
        paths = sorted(Path(inputs).iterdir()) if isinstance(inputs, Path) else list(inputs)
        naming = OutputNaming(work / out, ext=args.ext)
        return pipe.run(FileSource(paths), FileSink(naming), serial=serial, config=config)

    # warm-up: compile / graph capture / cuDNN / detector, on a few images through both paths (not timed below)
    print("warming up ...", flush=True)
    warm = Stopwatch().start()
    warm_in = sorted(folder.iterdir())[: 1 if args.tiny else 8]
    graphed = bool(tune_info.get("effective", {}).get("cuda_graph"))
    with torch.inference_mode():
        for b in ([k for k in (1, 2, 4, 8, 16, 32, 64) if k <= batch] if graphed else [batch]):
            restorer(torch.zeros(b, 3, restorer.size, restorer.size, device=device, dtype=restorer.dtype))
    capture = getattr(detector, "capture_graphs", None)
    if capture is not None:
        capture()                         # the detector's P-Net graphs, every batch bucket (as the generator's)
    run(pipelines["default"], warm_in, "warm_serial", serial=True)
    run(pipelines["default"], warm_in, "warm_pipe")
    warmup_s = warm.elapsed()

    runs, summaries = {}, {}
    serial_inputs = sorted(folder.iterdir())[: args.serial_images] if args.serial_images else folder
    if not args.skip_serial:
        print("serial path ...", flush=True)
        runs["serial"], summaries["serial"] = measure(
            "serial", lambda: run(pipelines["default"], serial_inputs, "out_serial", serial=True), meter, device)
    ab = [k for k, v in vars(args).items() if k.startswith("ab_") and v not in (None, False)]
    if ab and args.warm_run:
        # the first full run of a process came out slower than the later ones (A/A/A runs, 2026-12-01: the first
        # A was the lowest in 3 of 4), which flattered the B of every A/B/A: one untimed run first
        print("pipeline, untimed warm run ...", flush=True)
        run(pipelines["default"], folder, "out_pipeline_warm")
    print("pipeline ...", flush=True)
    runs["pipeline"], summaries["pipeline"] = measure("pipeline", lambda: run(pipelines["default"], folder,
                                                                              "out_pipeline"), meter, device)
    variants = {
        "ab_detector_process": ("pipeline_detector_process", "detector in its own process",
                                {"detector_process": True}),
        "ab_paste_torch": ("pipeline_paste_torch", "device paste and crop through the PyTorch twins",
                           {"paste_impl": "torch"}),
        "ab_cut_on_cpu": ("pipeline_cut_on_cpu", "faces cut on the CPU", {"cut_on_device": False}),
        "ab_paste": (f"pipeline_paste_{args.ab_paste}", f"--paste {args.ab_paste}", {"paste": args.ab_paste}),
    }
    for key in ab:
        name, what, changes = variants[key]
        pipe_b = pipelines.setdefault(key, make(**changes))
        run(pipe_b, warm_in, f"warm_{key}")                     # its detector service / kernels start untimed
        print(f"pipeline, {what} ...", flush=True)
        runs[name], summaries[name] = measure(name, lambda p=pipe_b, k=key: run(p, folder, f"out_{k}"), meter,
                                              device)
        print("pipeline again, as before (A/B/A) ...", flush=True)
        runs[f"{name}_then_default"], _ = measure(
            f"{name}_then_default", lambda k=key: run(pipelines["default"], folder, f"out_{k}_a2"), meter, device)
        runs[name]["outputs_vs_pipeline"] = compare_outputs(summaries["pipeline"].results, summaries[name].results)
    pipe = runs["pipeline"]
    pipe["stage_analysis"] = limiting_stage(pipe)
    result = {
        "benchmark": "throughput",
        "command": command,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": environment(device),
        "model": args.model,
        "weights": args.weights,
        "tune": tune_info,
        "settings": {"batch": batch, "workers": args.workers, "prepare_workers": pipe["stages"].get("prepare_workers"),
                     "max_wait_ms": args.max_wait_ms, "paste": args.paste, "detect_batch": args.detect_batch,
                     "detector_process": args.detector_process, "serial_images": args.serial_images,
                     "detector": detector.name, "detector_pnet_graphs": getattr(detector, "uses_pnet_graphs", None),
                     "det_size": settings.det_size, "max_inflight": pipe["stages"].get("max_inflight")},
        "folder": composition,
        "warmup_s": round(warmup_s, 2),
        "runs": runs,
    }
    if "serial" in runs:
        ser = runs["serial"]
        result["speedup_vs_serial"] = round(ser["wall_s"] / pipe["wall_s"], 2) if ser["faces"] == pipe["faces"] \
            else round(pipe["faces_per_s"] / max(ser["faces_per_s"], 1e-9), 2)
        result["outputs_vs_serial"] = compare_outputs(summaries["serial"].results, summaries["pipeline"].results)
    if device.type == "cuda" and args.model == "GPEN-BFR-512":
        result["targets"] = {
            "faces_per_s": {"target": TARGETS["faces_per_s"], "got": pipe["faces_per_s"],
                            "met": pipe["faces_per_s"] >= TARGETS["faces_per_s"]},
            "speedup_vs_serial": {"target": TARGETS["speedup_vs_serial"], "got": result.get("speedup_vs_serial"),
                                  "met": (result.get("speedup_vs_serial") or 0) >= TARGETS["speedup_vs_serial"]},
            "gpu_busy": {"target": TARGETS["gpu_busy"], "got": pipe["gpu_busy"],
                         "met": (pipe["gpu_busy"] or 0) >= TARGETS["gpu_busy"]},
        }
    result["total_s"] = round(whole.elapsed(), 1)
    for p in pipelines.values():
        p.close()
    detector.close()
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)

    args.out.mkdir(parents=True, exist_ok=True)
    tag = result["environment"].get("gpu", device.type).replace(" ", "-")
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}_throughput_{tag}_{args.model}.json"
    path.write_text(json.dumps(result, indent=2))
    print(table(result))
    print(f"wrote {path}")
    return 0


def table(result: dict) -> str:
    rows = ["| path | images/s | faces/s | wall s | GPU busy | peak GPU alloc MiB | peak RSS MiB |",
            "|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        busy = "-" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
        rows.append(f"| {name} | {r['images_per_s']} | {r['faces_per_s']} | {r['wall_s']} | {busy} | "
                    f"{r.get('peak_gpu_allocated_mib', '-')} | {r['peak_host_rss_mib']} |")
    extra = [f"speedup vs serial: {result.get('speedup_vs_serial')}",
             f"pipeline limited by: {result['runs']['pipeline']['stage_analysis']['limiting']}",
             f"outputs vs serial: {result.get('outputs_vs_serial')}"]
    return "\n".join(rows + extra)


if __name__ == "__main__":
    raise SystemExit(main())
