"""A 4 GiB GPU emulated on a big one: the whole pipeline (detector, GPEN-BFR-512, paste) over a folder under
`torch.cuda.set_per_process_memory_fraction`, with --preset low-memory or `auto` as a 4 GiB card would choose.

Targets (issue: CPU-only and 4 GB-GPU users): peak allocated <= 700 MiB, peak reserved <= 1.5 GiB, no
out-of-memory over the folder. `auto` is decided from min(free, cap) and the cap as total, which is what
`torch.cuda.mem_get_info` reports on a real card of that size. The JSON has the peaks, faces/s, the restorer's
OOM splits and fallbacks, failures and the command.

    python benchmarks/low_memory.py --photos 1024 --preset low-memory --out benchmarks/results
    python benchmarks/low_memory.py --photos 1024 --preset auto --cap-gib 4
    python benchmarks/low_memory.py --photos 24 --snapshot out/mem.pickle   # where the peak goes (memory history)

A/B levers of this script only: --batch (faces per generator call), --paste (where faces are pasted back),
--expandable (the caching allocator's expandable segments, which return freed memory in pages).
"""

from __future__ import annotations

import argparse
import json
import pickle
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_result  # noqa: E402
from timing import Stopwatch  # noqa: E402

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


def where_the_peak_goes(snapshot: dict, device_index: int, top: int = 25) -> list[dict]:
    """Replay the allocator's history to its peak of live bytes; the live bytes there, by the first line of this
    project in each allocation's stack (else the first frame)."""
    events = snapshot["device_traces"][device_index]
    live, total, best, best_at = {}, 0, -1, -1
    for i, e in enumerate(events):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
            if total > best:
                best, best_at = total, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])
    live = {}
    for e in events[:best_at + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    by_site: dict[str, list[int]] = {}
    for e in live.values():
        frames = e.get("frames") or []
        ours = [f for f in frames if "gpen_tune" in f["filename"]] or frames[:1]
        site = f"{ours[0]['filename'].split('gpen_tune/')[-1]}:{ours[0]['line']} {ours[0]['name']}" if ours else "?"
        entry = by_site.setdefault(site, [0, 0])
        entry[0] += e["size"]
        entry[1] += 1
    rows = sorted(by_site.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"site": k, "mib": round(v[0] / MiB, 1), "blocks": v[1]} for k, v in rows]


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda", torch.cuda.current_device())
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(args.cap_gib * GiB)
    if args.expandable:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    name, tune, why = tune_for(args.preset, cap, device)
    settings = EnhanceSettings(model=args.model, weights=args.weights, device="cuda", detector=args.detector,
                               batch_size=args.batch, paste=args.paste)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in", Path(tmp) / "out"
        src.mkdir()
        photo_folder(src, args.photos)
        torch.cuda.reset_peak_memory_stats(device)
        if args.snapshot:
            torch.cuda.memory._record_memory_history(max_entries=1_000_000)
        with Pipeline(settings, tune) as pipe:
            with Stopwatch() as sw:
                result = enhance([str(src)], out, pipeline=pipe)
            wall = sw.seconds
            restorer = pipe.restorer
            faces = result.summary.faces
            peak_allocated = torch.cuda.max_memory_allocated(device)
            peak_reserved = torch.cuda.max_memory_reserved(device)
            peak_sites = None
            if args.snapshot:
                args.snapshot.parent.mkdir(parents=True, exist_ok=True)
                snapshot = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                peak_sites = where_the_peak_goes(snapshot, device.index)
                with open(args.snapshot, "wb") as f:
                    pickle.dump(snapshot, f)
            # the generator alone at the pipeline's batch limit: what the restore step needs of the peak
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            crops = [np.zeros((restorer.size, restorer.size, 3), np.uint8)] * restorer.limit
            restorer.restore_crops(crops)
            torch.cuda.synchronize(device)
            generator_peak = (torch.cuda.max_memory_allocated(device) - base) / MiB
            model = restorer.model
            weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) if model else 0
            return {
                "preset": name, "reason": why, "config": tune.describe(), "cap_gib": args.cap_gib,
                "photos": args.photos, "faces": faces, "wall_s": wall, "faces_per_s": faces / wall if wall else 0,
                "failed": result.summary.failed, "errors": [j.error for j in result.summary.results if j.error][:5],
                "batch": args.batch, "paste": args.paste, "expandable_segments": args.expandable,
                "generator_weights_mib": weights / MiB, "generator_call_peak_mib": generator_peak,
                "allocated_after_run_mib": base / MiB,
                "peak_allocated_mib": peak_allocated / MiB, "peak_reserved_mib": peak_reserved / MiB,
                "peak_by_site": peak_sites, "batch_limit": restorer.limit, "oom_splits": restorer.times.oom_splits,
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
    ap.add_argument("--batch", type=int, default=None, help="faces per generator call (default: the restorer's)")
    ap.add_argument("--paste", default="auto", choices=["auto", "cpu", "gpu"])
    ap.add_argument("--expandable", action="store_true", help="the allocator's expandable segments")
    ap.add_argument("--snapshot", type=Path, default=None, help="dump the CUDA memory history (pickle) here")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/low_memory.py: needs a CUDA GPU (it emulates a 4 GiB one on it)")
    result = {"command": "python " + " ".join(shlex.quote(a) for a in sys.argv), "torch": torch.__version__,
              "device_name": torch.cuda.get_device_name(), **run(args)}
    print(json.dumps({k: v for k, v in result.items() if k != "fallbacks"}, indent=1))
    tag = "".join([f"_bs{args.batch}" if args.batch else "", f"_paste-{args.paste}" if args.paste != "auto" else "",
                   "_expandable" if args.expandable else ""])
    print(write_result(args.out, f"low_memory_{args.preset}{tag}", result))


if __name__ == "__main__":
    main()
