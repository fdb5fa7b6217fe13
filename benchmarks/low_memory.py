"""A 4 GiB GPU emulated on a big one: the whole pipeline (detector, GPEN-BFR-512, paste) over a folder under
`torch.cuda.set_per_process_memory_fraction`, with --preset low-memory or `auto` as a 4 GiB card would choose.

Targets (issue: CPU-only and 4 GB-GPU users): peak allocated <= 700 MiB, peak reserved <= 1.5 GiB, no
out-of-memory over the folder. `auto` is decided from min(free, cap) and the cap as total, which is what
`torch.cuda.mem_get_info` reports on a real card of that size. The JSON has the peaks, faces/s, the restorer's
OOM splits and fallbacks, failures and the command.

    python benchmarks/low_memory.py --photos 1024 --preset low-memory --out benchmarks/results
    python benchmarks/low_memory.py --photos 1024 --preset auto --cap-gib 4
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.pipeline import EnhanceSettings, Pipeline, enhance  # noqa: E402
from gpen_tune.tune.options import PRESETS, GiB, choose_preset  # noqa: E402

MiB = 1024**2


def photo_folder(folder: Path, n: int) -> int:
    """n JPEG photos cycling through the bundled ones (one face, several faces); returns the faces expected."""
    pictures = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(6, seed=1)]
    for i in range(n):
        img = pictures[i % len(pictures)]
        Image.fromarray(np.ascontiguousarray(img)).save(folder / f"photo_{i:05d}.jpg", quality=90)
    return n


def tune_for(preset: str, cap_bytes: int, device: torch.device):
    if preset != "auto":
        return preset, PRESETS[preset], f"preset {preset}"
    free, _ = torch.cuda.mem_get_info(device)
    return choose_preset(min(free, cap_bytes), cap_bytes)


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(args.cap_gib * GiB)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    name, tune, why = tune_for(args.preset, cap, device)
    settings = EnhanceSettings(model=args.model, weights=args.weights, device="cuda", detector=args.detector)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in", Path(tmp) / "out"
        src.mkdir()
        photo_folder(src, args.photos)
        torch.cuda.reset_peak_memory_stats(device)
        with Pipeline(settings, tune) as pipe:
            t0 = time.perf_counter()
            result = enhance([str(src)], out, pipeline=pipe)
            wall = time.perf_counter() - t0
            restorer = pipe.restorer
            faces = result.summary.faces
            return {
                "preset": name, "reason": why, "config": tune.describe(), "cap_gib": args.cap_gib,
                "photos": args.photos, "faces": faces, "wall_s": wall, "faces_per_s": faces / wall if wall else 0,
                "failed": result.summary.failed, "errors": [j.error for j in result.summary.results if j.error][:5],
                "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / MiB,
                "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / MiB,
                "batch_limit": restorer.limit, "oom_splits": restorer.times.oom_splits,
                "fallbacks": list(restorer.fallbacks), "skipped": dict(restorer.skipped),
                "targets": {"peak_allocated_mib": 700, "peak_reserved_mib": 1536},
            }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--photos", type=int, default=1024)
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--detector", default="mtcnn", help="mtcnn: weights in its wheel, runs offline")
    ap.add_argument("--preset", default="low-memory", choices=["auto", *PRESETS])
    ap.add_argument("--cap-gib", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/low_memory.py: needs a CUDA GPU (it emulates a 4 GiB one on it)")
    result = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(), **run(args)}
    print(json.dumps({k: v for k, v in result.items() if k != "fallbacks"}, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}_low_memory_{args.preset}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.rename(path)
    print(path)


if __name__ == "__main__":
    main()
