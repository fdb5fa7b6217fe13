"""End-to-end folder throughput: the serial driver and the pipelined runner on the same folder, in the same run.

Builds a folder of real photos from the bundled test images (scikit-image's astronaut, matplotlib's Grace Hopper):
  copy      the photo as a JPEG (1 face, 512 px)
  crop      one tile of a mosaic (1 face, ~550 px)
  upscale   a photo or a mosaic upscaled x2..x3 (1 or 6 faces, 1280..3300 px: exercises the paste on big frames)
  mosaic    4, 6, 9, 12 or 16 faces at different scales and rotations on one canvas (1100..2200 px)
and repeats them (file copies) up to --images. Then, for the serial path (`enhance_paths`, what `enhance --serial`
runs) and for the pipeline (`gpen_tune.throughput`), it measures wall time, images/s, faces/s, the GPU busy
fraction (sum of CUDA-event-timed generator calls / wall; also NVML utilisation when pynvml is there), peak GPU
memory (allocated and reserved), peak host RSS, and the pipeline's per-stage timings, and compares the outputs.

    # GPU (the lead's run; ~3-5 minutes on an H200 including compile warm-up):
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
import threading
import time
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.face.pipeline import Enhancer, EnhanceSettings  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.restore.restorer import Restorer, build_restorer  # noqa: E402
from gpen_tune.throughput import enhance_folder  # noqa: E402

TARGETS = {"faces_per_s": 300.0, "speedup_vs_serial": 3.0, "gpu_busy": 0.80}


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


# ---------------------------------------------------------------------------------------------------- meters


class BusyMeter:
    """Wraps the restore callable: CUDA events around every generator call (evaluated after the run)."""

    def __init__(self, restore):
        self.restore = restore
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.cpu_s = 0.0
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.device.type != "cuda":
            t = time.perf_counter()
            y = self.restore(x)
            self.cpu_s += time.perf_counter() - t
            return y
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = self.restore(x)
        end.record()
        self.events.append((start, end))
        return y

    def clear(self) -> None:
        self.events, self.cpu_s, self.calls = [], 0.0, 0
        self.origin = None
        if torch.cuda.is_available():
            self.origin = torch.cuda.Event(enable_timing=True)   # t = 0 of the run's GPU timeline
            self.origin.record()

    def seconds(self) -> float:
        if self.events:
            torch.cuda.synchronize()
        return self.cpu_s + sum(s.elapsed_time(e) for s, e in self.events) / 1000.0

    def timeline(self, wall_s: float) -> dict | None:
        """When the generator ran, from the run's start: its first batch, the end of its last one, and its busy
        share of the middle of the run (10-90 % of the wall time), without the ramp-up (first decodes and
        detections) and the drain (last pastes and writes)."""
        if not self.events or self.origin is None:
            return None
        torch.cuda.synchronize()
        spans = sorted((self.origin.elapsed_time(s) / 1000.0, self.origin.elapsed_time(e) / 1000.0)
                       for s, e in self.events)
        lo, hi = 0.1 * wall_s, 0.9 * wall_s
        inside = sum(max(0.0, min(e, hi) - max(s, lo)) for s, e in spans)
        return {"first_batch_s": round(spans[0][0], 3), "last_batch_end_s": round(spans[-1][1], 3),
                "gpu_busy_10_90": round(inside / (hi - lo), 3)}


def _thread_cpu_ticks() -> dict[int, int]:
    """CPU time (user + system, clock ticks) of every live thread of this process, by native thread id."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks[int(tid)] = int(fields[11]) + int(fields[12])     # utime, stime (fields 14, 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return ticks


def _thread_group(name: str) -> str:
    """gpen-prep17 -> gpen-prep: one row per kind of thread."""
    return name.rstrip("0123456789") or name


class Sampler:
    """Background sampling of host RSS, CPU seconds per kind of thread (is a stage CPU-bound or waiting?), and
    NVML GPU utilisation when pynvml is importable."""

    def __init__(self, device: torch.device, period: float = 0.05):
        self.period = period
        self.rss_peak = 0
        self.util: list[float] = []
        self._ticks0: dict[int, int] = {}
        self._ticks: dict[int, int] = {}
        self._names: dict[int, str] = {}
        self._times0 = os.times()
        self.process_cpu_s = 0.0
        self._stop = threading.Event()
        self._nvml = None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                idx = device.index if device.index is not None else torch.cuda.current_device()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(idx))
            except Exception:  # noqa: BLE001 - NVML is optional
                self._nvml = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample_threads(self) -> None:
        if not os.path.isdir("/proc/self/task"):
            return
        for t in threading.enumerate():
            if t.native_id is not None:
                self._names[t.native_id] = _thread_group(t.name)
        self._ticks.update(_thread_cpu_ticks())

    def cpu_by_thread(self) -> dict[str, dict]:
        """CPU seconds during the run per kind of thread (threads not started by Python: "native"), with the
        number of threads; threads that ended between two samples lose their last period."""
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        out: dict[str, dict] = {}
        for tid, ticks in self._ticks.items():
            used = (ticks - self._ticks0.get(tid, 0)) / hz
            if used <= 0:
                continue
            row = out.setdefault(self._names.get(tid, "native"), {"cpu_s": 0.0, "threads": 0})
            row["cpu_s"] += used
            row["threads"] += 1
        return {k: {"cpu_s": round(v["cpu_s"], 2), "threads": v["threads"]}
                for k, v in sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])}

    def _run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        while not self._stop.is_set():
            self._sample_threads()
            try:
                with open("/proc/self/statm") as f:
                    self.rss_peak = max(self.rss_peak, int(f.read().split()[1]) * page)
            except OSError:
                pass
            if self._nvml is not None:
                nv, h = self._nvml
                self.util.append(nv.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            self._stop.wait(self.period)

    def __enter__(self):
        if os.path.isdir("/proc/self/task"):
            self._ticks0 = _thread_cpu_ticks()
        self._times0 = os.times()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample_threads()
        t1 = os.times()
        self.process_cpu_s = (t1.user - self._times0.user) + (t1.system - self._times0.system)


# ---------------------------------------------------------------------------------------------------- runs


def measure(name: str, run, meter: BusyMeter, device: torch.device) -> dict:
    """Run one path and return its numbers."""
    meter.clear()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with Sampler(device) as sampler:
        t0 = time.perf_counter()
        summary = run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
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
    for r in summary.results:
        job = getattr(r.job, "job", r.job)          # the runner's item wraps the pipeline's ImageJob
        for k, v in (getattr(job, "timings", None) or {}).items():
            total[k] = total.get(k, 0.0) + v
    return {k: round(v, 3) for k, v in sorted(total.items())}


class DetectorPhases:
    """--detector-phases: wall seconds of the batched MTCNN driver's phases, summed over calls (diagnostics; the
    P-Net phase gets a stream sync at its end so its GPU time is not billed to the candidates phase)."""

    def __init__(self) -> None:
        from gpen_tune.face import mtcnn_batched as mb

        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        for owner, name, key, sync in ((mb.FixedCanvasPNet, "__call__", "pnet_fill_upload_replay", True),
                                       (mb.FixedCanvasPNet, "_host_canvas", "pnet_wait_previous_upload", False),
                                       (mb.FixedCanvasPNet, "_planes", "pnet_planes", False),
                                       (mb._Driver, "_candidates", "pnet_candidates_nms", False),
                                       (mb._Driver, "_stage2", "rnet", False), (mb._Driver, "_stage3", "onet", False),
                                       (mb._Driver, "_finish", "download_final_nms", False)):
            self._wrap(owner, name, key, sync)

    def _wrap(self, owner, name: str, key: str, sync: bool) -> None:
        fn = getattr(owner, name)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            if sync and torch.cuda.is_available():
                t1 = time.perf_counter()
                torch.cuda.current_stream().synchronize()
                self._add(key + "_gpu_wait", time.perf_counter() - t1)
                self._add(key, t1 - t0)
            else:
                self._add(key, time.perf_counter() - t0)
            return out

        setattr(owner, name, timed)

    def _add(self, key: str, dt: float) -> None:
        self.seconds[key] = self.seconds.get(key, 0.0) + dt
        self.calls[key] = self.calls.get(key, 0) + 1

    def reset(self) -> None:
        self.seconds, self.calls = {}, {}

    def report(self) -> dict:
        return {k: {"s": round(v, 3), "calls": self.calls[k]} for k, v in self.seconds.items()}


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
    ap.add_argument("--ab-caller-shrink", action="store_true",
                    help="also run the pipeline with the previous detector thread (it shrinks every image itself, "
                         "on the default CUDA stream): A/B in the same run")
    ap.add_argument("--ab-detector-process", action="store_true",
                    help="also run the pipeline with the detector in a process of its own (own GIL, own CUDA "
                         "context; pixels through shared memory): A/B in the same run")
    ap.add_argument("--ab-process-repeat", action="store_true",
                    help="with --ab-detector-process: A/B/A/B (thread, process, thread, process) in the same run")
    ap.add_argument("--no-warm-run", dest="warm_run", action="store_false",
                    help="with an --ab-* flag: skip the untimed full pipeline run before the timed A/B/A runs")
    ap.add_argument("--ab-switch-interval", type=float, default=None, metavar="SECONDS",
                    help="also run the pipeline with the GIL switch interval SECONDS during the run (the runner's "
                         "default is 0.0002; Python's own is 0.005: a thread that wants the GIL waits up to that long "
                         "for a thread running Python code), then the default again: A/B/A in the same run")
    ap.add_argument("--ab-mtcnn-before", type=Path, default=None, metavar="FILE",
                    help="also run the pipeline with an earlier mtcnn_batched.py as the detector's driver, then "
                         "this checkout's again: A/B/A in the same run")
    ap.add_argument("--ab-pnet-graphs", action="store_true",
                    help="A/B/A in the same run: the detector's P-Net eager instead of from CUDA graphs")
    ap.add_argument("--ab-paste-torch", action="store_true",
                    help="A/B/A in the same run: the GPU paste in PyTorch calls instead of one Triton kernel")
    ap.add_argument("--ab-paste", default=None, choices=("auto", "cpu", "gpu"),
                    help="A/B/A in the same run: the pipeline with this --paste instead")
    ap.add_argument("--ab-nms-torchvision", action="store_true",
                    help="A/B/A in the same run: the detector's NMS through torchvision's nms vs the per-group kernel")
    ap.add_argument("--detector-phases", action="store_true",
                    help="diagnostics: time the MTCNN driver's phases during the pipeline run (adds one stream sync "
                         "per detector call)")
    ap.add_argument("--ab-cut-on-cpu", action="store_true",
                    help="A/B/A in the same run: every face cut on the CPU and uploaded by the GPU stage, instead of "
                         "cut on the GPU from the image the paste uploads anyway")
    ap.add_argument("--ab-area-torch", action="store_true",
                    help="A/B/A in the same run: the detector's area resize in PyTorch calls instead of one Triton "
                         "kernel (P-Net graphs re-captured before each timed run)")
    ap.add_argument("--ab-detector-batch", type=int, default=None, metavar="N",
                    help="A/B/A in the same run: up to N images per detector call and N prepare threads (P-Net "
                         "graphs captured up to N before the timed run)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the folders go (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)

    if args.tiny:
        args.model, args.weights = "GPEN-BFR-256", "synthetic"
        args.device = "cpu" if args.device == "auto" else args.device
        args.preset = "none" if args.preset == "speed" else args.preset
        args.images = args.images or 4
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    args.images = args.images or (480 if device.type == "cuda" else 8)
    batch = args.batch or (32 if device.type == "cuda" else 4)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    t_start = time.perf_counter()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpen-throughput-"))
    folder = work / "in"
    print(f"building {args.images} images in {folder} ...", flush=True)
    t = time.perf_counter()
    composition = build_folder(folder, args.images, args.tiny)
    composition["build_s"] = round(time.perf_counter() - t, 2)

    torch.backends.cudnn.benchmark = False
    model = load_model(args.weights, model=args.model, device=device)
    restore, tune_info = build_restore(model, args.preset, device, batch)
    effective = tune_info.get("effective", {})
    # torch.compile: one input shape, one compile (every batch padded to `batch`); CUDA graphs alone pad each
    # batch to its bucket (1, 2, 4, ..., batch), all captured during the warm-up below
    compiled_or_graphed = bool(effective.get("compile"))
    graphed = bool(effective.get("cuda_graph"))
    meter = BusyMeter(restore.forward)
    restore.forward = meter                 # CUDA events around every generator call (the Restorer pads compiled)
    restore_fn = restore
    settings = EnhanceSettings(model=args.model, weights=args.weights, detector=args.detector, device=device.type,
                               batch_size=batch, det_size=args.det_size or None)
    inner = getattr(restore, "model", None)
    enhancer = Enhancer(settings, model=inner if inner is not None else model, restore=restore)

    # warm-up: compile / graph capture / cuDNN / detector, on a few images through both paths (not timed below)
    print("warming up ...", flush=True)
    t = time.perf_counter()
    warm_in = sorted(folder.iterdir())[: 1 if args.tiny else 8]
    with torch.inference_mode():
        for b in ([k for k in (1, 2, 4, 8, 16, 32, 64) if k <= batch] if graphed and not compiled_or_graphed
                  else [batch]):
            restore_fn(torch.zeros(b, 3, enhancer.size, enhancer.size, device=device, dtype=enhancer.dtype))
    capture = getattr(enhancer.detector, "capture_graphs", None)
    if capture is not None:
        capture()                         # the detector's P-Net graphs, every batch bucket (as the generator's)
    enhance_folder(warm_in, work / "warm_serial", enhancer=enhancer, serial=True, ext=args.ext)
    if args.detector_process and args.ab_detector_process:
        ap.error("--detector-process and --ab-detector-process: use one")
    in_process_detector = enhancer.detector     # the serial path keeps it when the pipeline's is a process
    enhance_folder(warm_in, work / "warm_pipe", enhancer=enhancer, workers=args.workers, ext=args.ext,
                   prepare_workers=args.prepare_workers, max_batch=batch,
                   paste=args.paste, detect_batch=args.detect_batch, bucket_batches=not compiled_or_graphed,
                   detector_process=args.detector_process)
    warmup_s = time.perf_counter() - t

    runs = {}
    summaries = {}
    serial_inputs = sorted(folder.iterdir())[: args.serial_images] if args.serial_images else folder
    if not args.skip_serial:
        print("serial path ...", flush=True)
        pipeline_detector = enhancer._detector
        enhancer._detector = in_process_detector if args.detector_process else pipeline_detector
        try:
            runs["serial"], summaries["serial"] = measure(
                "serial", lambda: enhance_folder(serial_inputs, work / "out_serial", enhancer=enhancer, serial=True,
                                                 ext=args.ext), meter, device)
        finally:
            enhancer._detector = pipeline_detector
    server = enhancer.detector                # the pipeline's BatchingDetector (installed by the warm-up run)
    for k in ("calls", "images", "largest", "busy_s"):
        if hasattr(server, k):
            setattr(server, k, 0)             # count the measured pipeline run only

    def pipeline(out: str):
        """One pipelined run of the folder into work/out with this run's settings (for measure)."""
        return lambda: enhance_folder(folder, work / out, enhancer=enhancer, workers=args.workers, ext=args.ext,
                                      prepare_workers=args.prepare_workers, max_batch=batch,
                                      max_wait_ms=args.max_wait_ms, paste=args.paste, detect_batch=args.detect_batch,
                                      bucket_batches=not compiled_or_graphed, detector_process=args.detector_process)

    ab = any(v not in (None, False) for k, v in vars(args).items() if k.startswith("ab_"))
    if ab and args.warm_run:
        # the first full run of a process came out slower than the later ones (A/A/A runs, 2026-12-01: the first
        # A was the lowest in 3 of 4), which flattered the B of every A/B/A: one untimed run first
        print("pipeline, untimed warm run ...", flush=True)
        pipeline("out_pipeline_warm")()
        for k in ("calls", "images", "largest", "busy_s"):
            if hasattr(server, k):
                setattr(server, k, 0)
    phases = DetectorPhases() if args.detector_phases else None
    print("pipeline ...", flush=True)
    runs["pipeline"], summaries["pipeline"] = measure("pipeline", pipeline("out_pipeline"), meter, device)

    def attach_phases(name: str) -> None:
        if phases is not None:
            runs[name]["detector_phases"] = phases.report()
            phases.reset()

    attach_phases("pipeline")
    detector_stats = {k: getattr(server, k, None) for k in ("calls", "images", "largest", "busy_s")}
    if detector_stats["busy_s"] is not None:  # share of the pipeline's wall time the detector thread was detecting
        detector_stats["busy_s"] = round(detector_stats["busy_s"], 3)
        detector_stats["busy_fraction"] = round(detector_stats["busy_s"] / runs["pipeline"]["wall_s"], 3)
    if args.ab_caller_shrink and hasattr(server, "_det_size"):
        # same run, same folder: the detector thread shrinks every image itself (the previous behaviour)
        kept, server._det_size = server._det_size, None
        server.own_stream = False
        print("pipeline, previous detector thread ...", flush=True)
        runs["pipeline_server_shrink"], _ = measure("pipeline_server_shrink", pipeline("out_pipeline_b"), meter, device)
        server._det_size, server.own_stream = kept, True
    def ab_a(name: str, what: str, out_dir: str, apply, restore) -> None:
        """A/B/A in the same run: the pipeline with a change (apply ... restore), then the default again (order
        effects show up in the repeat)."""
        apply()
        print(f"pipeline, {what} ...", flush=True)
        try:
            runs[name], _ = measure(name, pipeline(out_dir), meter, device)
            attach_phases(name)
        finally:
            restore()
        print("pipeline again, as before (A/B/A) ...", flush=True)
        runs["pipeline_repeat"], _ = measure("pipeline_repeat", pipeline("out_pipeline_a2"), meter, device)
        attach_phases("pipeline_repeat")

    def ab_attr(name: str, what: str, out_dir: str, owner, attr: str, value) -> None:
        """ab_a for one attribute (a module switch, a detector field): B sets it to `value`, then it is put back."""
        kept = getattr(owner, attr)
        ab_a(name, what, out_dir, lambda: setattr(owner, attr, value), lambda: setattr(owner, attr, kept))

    if args.ab_switch_interval:
        from gpen_tune.throughput import runner as runner_module

        # the runner sets min(the interpreter's interval, runner.SWITCH_INTERVAL_S) for its run: B changes that
        # constant (until 2026-12-01 06:40 this flag set the interpreter's interval, which the runner's 0.2 ms
        # overrode for any value above it: those "B" runs were the default again, i.e. A/A/A runs)
        ab_attr("pipeline_switch_interval", f"GIL switch interval {args.ab_switch_interval * 1e3:g} ms during the run",
                "out_pipeline_si", runner_module, "SWITCH_INTERVAL_S", args.ab_switch_interval)
        runs["pipeline_switch_interval"]["switch_interval_s"] = args.ab_switch_interval
    if args.ab_mtcnn_before:
        import importlib.util

        import gpen_tune.face.mtcnn_batched as current

        spec = importlib.util.spec_from_file_location("mtcnn_batched_before", args.ab_mtcnn_before)
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
        kept_driver = current.detect_mtcnn_batched

        def set_driver(fn):
            current.detect_mtcnn_batched = fn

        ab_a("pipeline_mtcnn_before", f"detector driver from {args.ab_mtcnn_before}", "out_pipeline_mb",
             lambda: set_driver(before.detect_mtcnn_batched), lambda: set_driver(kept_driver))
    if args.ab_pnet_graphs:
        ab_attr("pipeline_pnet_eager", "detector's P-Net eager (no CUDA graphs)", "out_pipeline_pe",
                getattr(server, "_inner", server), "pnet_graphs", False)
    if args.ab_paste_torch:
        from gpen_tune.throughput import gpu_paste

        ab_attr("pipeline_paste_torch", "GPU paste in PyTorch calls (no Triton kernel)", "out_pipeline_pt",
                gpu_paste, "USE_TRITON", False)
    if args.ab_paste:
        ab_attr(f"pipeline_paste_{args.ab_paste}", f"--paste {args.ab_paste}", "out_pipeline_pm", args, "paste",
                args.ab_paste)
    if args.ab_cut_on_cpu:
        from gpen_tune.throughput import stages as stages_module

        ab_attr("pipeline_cut_on_cpu", "faces cut on the CPU, uploaded by the GPU stage", "out_pipeline_cc",
                stages_module, "CUT_ON_DEVICE", False)
    if args.ab_area_torch:
        from gpen_tune.face import area_triton

        mtcnn = getattr(server, "_inner", server)

        def set_area(value):
            area_triton.USE_TRITON = value
            mtcnn._fixed = None                # the P-Net graphs hold the kernels they were captured with
            mtcnn.capture_graphs()

        ab_a("pipeline_area_torch", "detector's area resize in PyTorch calls", "out_pipeline_at",
             lambda: set_area(False), lambda: set_area(True))
    if args.ab_nms_torchvision:
        from gpen_tune.face import nms_triton

        ab_attr("pipeline_nms_torchvision", "detector's NMS through torchvision (one greedy pass over all groups)",
                "out_pipeline_nt", nms_triton, "USE_TRITON", False)
    if args.ab_detector_batch:
        mtcnn = getattr(server, "_inner", server)
        kept_det = (mtcnn.max_batch, server._max_images, args.prepare_workers)

        def set_det_batch(n, images, threads):
            mtcnn.max_batch, server._max_images, args.prepare_workers = n, images, threads
            mtcnn._fixed = None
            mtcnn.capture_graphs()

        n = args.ab_detector_batch
        ab_a(f"pipeline_detector_batch_{n}", f"up to {n} images per detector call, {n} prepare threads",
             "out_pipeline_db", lambda: set_det_batch(n, n, n), lambda: set_det_batch(*kept_det))
    process_detector = None
    if args.ab_detector_process:
        def run_with_process_detector(inputs, out: Path):
            return enhance_folder(inputs, out, enhancer=enhancer, workers=args.workers, ext=args.ext,
                                  prepare_workers=args.prepare_workers, max_batch=batch,
                                  max_wait_ms=args.max_wait_ms, paste=args.paste, detect_batch=args.detect_batch,
                                  bucket_batches=not compiled_or_graphed, detector_process=True)

        print("pipeline, detector in its own process (start + warm-up not timed) ...", flush=True)
        # the first run spawns the detector process (it replaces the detector thread) and warms its detector;
        # the child's memory is not in this process's RSS / GPU peaks below
        t_proc = time.perf_counter()
        run_with_process_detector(warm_in[:1], work / "warm_proc0")
        proc_start_s = time.perf_counter() - t_proc            # spawn, import, CUDA context, build, graph capture
        run_with_process_detector(warm_in, work / "warm_proc")
        proc = enhancer.detector
        for k in ("calls", "images", "largest"):
            setattr(proc, k, 0)
        runs["pipeline_detector_process"], summaries["pipeline_detector_process"] = measure(
            "pipeline_detector_process", lambda: run_with_process_detector(folder, work / "out_pipeline_proc"),
            meter, device)
        process_detector = {k: getattr(proc, k) for k in ("calls", "images", "largest")}
        process_detector["start_s"] = round(proc_start_s, 2)
        process_detector["outputs_vs_pipeline"] = compare_outputs(summaries["pipeline"].results,
                                                                  summaries["pipeline_detector_process"].results)
        if args.ab_process_repeat:       # A/B/A/B: the detector thread again, then the process again
            enhancer._detector = server
            print("pipeline again with the detector thread ...", flush=True)
            runs["pipeline_repeat"], _ = measure("pipeline_repeat", pipeline("out_pipeline_a2"), meter, device)
            enhancer._detector = proc
            print("pipeline again with the detector process ...", flush=True)
            runs["pipeline_detector_process_repeat"], _ = measure(
                "pipeline_detector_process_repeat", lambda: run_with_process_detector(folder, work / "out_proc2"),
                meter, device)
        proc.close()
        enhancer._detector = server           # back to the detector thread (the process one replaced it)
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
        "detector_server": detector_stats,      # of the "pipeline" run (A/B runs after it not counted)
        **({"detector_process": process_detector} if process_detector is not None else {}),
        "settings": {"batch": batch, "fixed_batch_padding": bool(compiled_or_graphed), "workers": args.workers,
                     "prepare_workers": pipe["stages"].get("prepare_workers"),
                     "max_wait_ms": args.max_wait_ms, "paste": args.paste, "detect_batch": args.detect_batch,
                     "detector_process": args.detector_process, "serial_images": args.serial_images,
                     "detector": enhancer.detector.name,
                     "detector_pnet_graphs": getattr(enhancer.detector, "uses_pnet_graphs", None),
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
    result["total_s"] = round(time.perf_counter() - t_start, 1)
    enhancer.close()
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
