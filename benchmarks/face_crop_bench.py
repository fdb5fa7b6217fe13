"""--face-crop on a >= 12 MP photo: whole-image time per stage and peak memory, face-crop on vs off.

The image: the bundled real photos' mosaic (12 faces at different scales and rotations) upscaled to >= 12 MP.
On:  detection on a copy with long side 1024, alignment/paste on each face's region (gpen-tune's default).
Off: detection at native resolution, full-frame paste canvases per face (upstream-like).
Peak memory: GPU allocated (CUDA) and host (tracemalloc: numpy/OpenCV buffers allocated from Python).
Usage:
    python benchmarks/face_crop_bench.py --device cuda --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import tracemalloc
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from timing import Stopwatch

MIN_MEGAPIXELS = 12.0


def big_photo(n_faces: int = 12, min_mp: float = MIN_MEGAPIXELS) -> np.ndarray:
    import cv2

    from gpen_tune.face.samples import mosaic

    base = mosaic(n_faces=n_faces, seed=0)
    h, w = base.shape[:2]
    k = math.sqrt(min_mp * 1e6 / (h * w)) * 1.01
    return cv2.resize(base, (math.ceil(w * k), math.ceil(h * k)), interpolation=cv2.INTER_CUBIC)


def run_once(pipe, image: np.ndarray, device: torch.device, host_memory: bool) -> dict:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    if host_memory:
        tracemalloc.start()
    from gpen_tune.pipeline.sinks import MemorySink
    from gpen_tune.pipeline.sources import ArraySource

    with Stopwatch(device) as sw:
        (job,) = pipe.run(ArraySource([image]), MemorySink(), serial=True).results
    out = {"seconds": sw.seconds, "faces": len(job.faces), "stages_s": dict(job.timings)}
    if host_memory:
        out["host_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    if device.type == "cuda":
        out["gpu_peak_allocated_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["gpu_peak_reserved_mib"] = torch.cuda.max_memory_reserved(device) / 2**20
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for face_crop-<model>-<device>.json")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--detector", default="auto")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from gpen_tune.load import load_model
    from gpen_tune.pipeline.api import Pipeline
    from gpen_tune.pipeline.settings import EnhanceSettings, detection_size
    from gpen_tune.restore import build_restorer
    from gpen_tune.tune import TuneConfig

    device = torch.device(args.device)
    image = big_photo()
    h, w = image.shape[:2]
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "cuda": torch.version.cuda, "platform": platform.platform(),
              "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
              "command": " ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
              "image": {"width": w, "height": h, "megapixels": round(w * h / 1e6, 2)}, "runs": {}}
    model = load_model(args.weights, model=args.model, device=device)
    restore = build_restorer(model, TuneConfig(), device=device)
    for on in (True, False):
        settings = EnhanceSettings(model=args.model, weights=args.weights, detector=args.detector,
                                   device=device.type if device.type in ("cuda", "cpu") else "auto",
                                   det_size=detection_size(None, on))
        with Pipeline(settings, TuneConfig(face_crop=on), restorer=restore) as pipe:
            run_once(pipe, image, device, host_memory=False)  # warm-up: detector build, cuDNN search
            timed = [run_once(pipe, image, device, host_memory=False) for _ in range(args.repeats)]
            mem = run_once(pipe, image, device, host_memory=True)
        key = "face_crop_on" if on else "face_crop_off"
        result["runs"][key] = {
            "settings": {"face_crop": on, "det_size": settings.det_size},
            "median_s": statistics.median(r["seconds"] for r in timed),
            "faces": timed[0]["faces"],
            "stages_s": {k: statistics.median(r["stages_s"].get(k, 0.0) for r in timed) for k in timed[0]["stages_s"]},
            "host_peak_mib": mem["host_peak_mib"],
            "gpu_peak_allocated_mib": mem.get("gpu_peak_allocated_mib"),
            "gpu_peak_reserved_mib": mem.get("gpu_peak_reserved_mib"),
        }
        print(key, json.dumps(result["runs"][key]))
    on, off = result["runs"]["face_crop_on"], result["runs"]["face_crop_off"]
    result["speedup"] = off["median_s"] / on["median_s"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cpu" if device.type == "cpu" else result["device_name"].replace(" ", "-").lower()
    path = out / f"face_crop-{args.model}-{dev}.json"
    fd, tmp = tempfile.mkstemp(dir=out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)
    print(f"{w}x{h} ({result['image']['megapixels']} MP): face-crop on {on['median_s']:.2f} s, off "
          f"{off['median_s']:.2f} s ({result['speedup']:.1f}x); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
