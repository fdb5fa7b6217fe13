"""Video throughput: a 1080p H.264 clip with one face and one with a group, serial path vs pipeline in one run,
plus the flicker inside the face with and without landmark smoothing.

The clips are made here from the bundled photos: "one face" is scikit-image's astronaut scaled to the frame height
on a grey 1920x1080 canvas, drifting sideways and zooming slowly; "group" is a 9-face mosaic of the astronaut and
Grace Hopper (gpen_tune.face.samples) moving the same way. Both are encoded with libx264 (crf 18) at 25 fps, with
no audio.
Flicker = mean absolute change of the restored face region between consecutive frames of a still face with
per-frame sensor noise (smaller is steadier), smoothing on vs off.

    python benchmarks/video.py --model GPEN-BFR-512 --preset speed --frames 300      # GPU
    python benchmarks/video.py --tiny                                                # CPU smoke (short clips)

Writes one JSON to --out (default benchmarks/results/) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from clip_files import decoded, pan_frames, write_clip  # noqa: E402
from meters import BusyMeter, Sampler  # noqa: E402
from throughput import environment, metered_pipeline  # noqa: E402
from timing import Stopwatch, bench_device  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.pipeline.api import Pipeline  # noqa: E402
from gpen_tune.video.stream import enhance_video  # noqa: E402

TARGETS = {"one_face_fps": 200.0, "speedup_vs_serial": 3.0}


def flicker(frames: list[np.ndarray], box: tuple[int, int, int, int]) -> float:
    x0, y0, x1, y1 = box
    crops = [f[y0:y1, x0:x1].astype(np.float32) for f in frames]
    return round(float(np.mean([np.abs(b - a).mean() for a, b in zip(crops, crops[1:], strict=False)])), 3)


def face_box(detector, frame: np.ndarray) -> tuple[int, int, int, int]:
    dets = detector.detect([frame])[0]
    x0, y0, x1, y1 = (int(v) for v in dets[0].box)
    return x0, y0, x1, y1


def run_clip(pipe: Pipeline, src: Path, dst: Path, serial: bool, meter: BusyMeter, device: torch.device,
             smooth: bool = True) -> dict:
    meter.clear()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    with Sampler(device) as sampler, Stopwatch(device) as sw:
        result = enhance_video(src, dst, pipe, serial=serial, smooth=smooth)
    wall = sw.seconds
    gen = meter.seconds()
    out = {"wall_s": round(wall, 3), "frames": result.frames, "faces": result.faces,
           "frames_per_s": round(result.frames / wall, 2), "faces_per_s": round(result.faces / wall, 2),
           "generator_s": round(gen, 3), "gpu_busy": round(gen / wall, 3) if device.type == "cuda" else None,
           "peak_host_rss_mib": round(sampler.rss_peak / 2**20, 1), "encoder": result.notes}
    if device.type == "cuda":
        out["peak_gpu_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU smoke: GPEN-BFR-256, 320x180 clips of 8 frames")
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--preset", default="speed", help="speed | balanced | low-memory | none")
    ap.add_argument("--frames", type=int, default=None, help="frames per clip (default 300 on CUDA, 24 on CPU)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--skip-serial", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    device = bench_device(args.device)
    size = (1920, 1080)
    if args.tiny:
        args.model, size = "GPEN-BFR-256", (320, 180)
        args.preset = "none" if args.preset == "speed" else args.preset
        args.frames = args.frames or 8
    n = args.frames or (300 if device.type == "cuda" else 24)
    batch = args.batch or (32 if device.type == "cuda" else 8)
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    work = Path(tempfile.mkdtemp(prefix="gpen-video-"))
    clips = {"one_face": write_clip(work / "one_face.mp4", pan_frames(samples.astronaut(), n, size)),
             "group": write_clip(work / "group.mp4", pan_frames(samples.mosaic(9, 4), n, size))}
    still = write_clip(work / "still.mp4", pan_frames(samples.astronaut(), min(n, 48), size, noise=6.0, still=True))

    pipe, detector, restorer, meter, tune_info = metered_pipeline(args.model, args.weights, args.preset, device,
                                                                  batch)
    print("warming up ...", flush=True)
    enhance_video(write_clip(work / "warm.mp4", pan_frames(samples.astronaut(), 8, size)), work / "warm_out.mp4",
                  pipe)
    runs: dict[str, dict] = {}
    for name, src in clips.items():
        for mode in ("pipeline", "serial"):
            if mode == "serial" and args.skip_serial:
                continue
            print(f"{name}, {mode} ...", flush=True)
            runs[f"{name}_{mode}"] = run_clip(pipe, src, work / f"{name}_{mode}.mp4", mode == "serial", meter,
                                              device)
    box = face_box(detector, decoded(still)[0])
    steadiness = {}
    for smooth in (True, False):
        dst = work / f"still_{smooth}.mkv"
        enhance_video(still, dst, pipe, smooth=smooth, crf=0)
        steadiness["smoothed" if smooth else "raw"] = flicker(decoded(dst), box)
    steadiness["input"] = flicker(decoded(still), box)
    result = {"benchmark": "video", "command": command, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "environment": environment(device), "model": args.model, "weights": args.weights, "tune": tune_info,
              "clips": {"size": list(size), "frames": n, "fps": 25, "codec": "libx264 crf 18",
                        "one_face": "astronaut drifting and zooming on a grey 16:9 canvas",
                        "group": "9-face mosaic, likewise"},
              "runs": runs, "flicker_inside_face": steadiness}
    for name in clips:
        s, p = runs.get(f"{name}_serial"), runs[f"{name}_pipeline"]
        if s:
            result[f"{name}_speedup_vs_serial"] = round(s["wall_s"] / p["wall_s"], 2)
    if device.type == "cuda" and args.model == "GPEN-BFR-512" and not args.tiny:
        fps = runs["one_face_pipeline"]["frames_per_s"]
        result["targets"] = {"one_face_fps": {"target": TARGETS["one_face_fps"], "got": fps,
                                              "met": fps >= TARGETS["one_face_fps"]}}
    pipe.close()
    detector.close()
    shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = result["environment"].get("gpu", device.type).replace(" ", "-")
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}_video_{tag}_{args.model}.json"
    path.write_text(json.dumps(result, indent=2))
    for k, r in runs.items():
        print(f"{k:20s} {r['frames_per_s']:8.2f} frames/s {r['faces_per_s']:8.2f} faces/s  busy {r['gpu_busy']}")
    print(f"flicker inside the face: {steadiness}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
