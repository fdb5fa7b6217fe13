"""Scale-out: faces/s with 1..N workers, for `--devices` (one pipeline per device in one process) and for Ray Data
(1..N restore actors), against the plain one-pipeline run on the same folder.

On a CPU host the "devices" are CPU stand-ins sharing the same cores, so the numbers show the overhead of the
sharing, not a speed-up (a process-mode row includes starting its worker processes, each loading the
generator); the GPU numbers come from the same script on a multi-GPU host:

    python benchmarks/scaling.py --device cpu --workers 1,2 --ray-actors 1,2 --images 6      # CPU, small
    python benchmarks/scaling.py --device cuda --workers 1,2,4,8 --ray-actors 1,2,4,8 --images 2000 \\
        --model GPEN-BFR-512 --weights GPEN-BFR-512

Inputs are mosaics of the bundled photos (`gpen_tune.face.samples.mosaic`); without --weights the generator is a
seeded synthetic checkpoint written in the official key layout (same speed as the released weights). Ray's wall
time includes starting Ray's actors (each loads the generator), which a long job amortizes; `first_result_s` is
the time to the first written image (a restore batch holds `batch_size` images, so small folders finish at once).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402
from timing import Stopwatch  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.pipeline.api import Pipeline, enhance  # noqa: E402
from gpen_tune.pipeline.settings import EnhanceSettings  # noqa: E402
from gpen_tune.tune.options import TuneConfig, resolve_preset  # noqa: E402


def write_folder(folder: Path, images: int, faces: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(images):
        Image.fromarray(samples.mosaic(faces, i)).save(folder / f"mosaic{i:04d}.png")


def official_checkpoint(model: str, folder: Path) -> str:
    import torch

    from gpen_tune.model.configs import model_info
    from gpen_tune.weights.checkpoint import synthetic_state_dict

    path = folder / f"{model}-synthetic.pth"
    torch.save(synthetic_state_dict(model_info(model).config, seed=0), path)
    return str(path)


def row(kind: str, workers: int, result, wall: float, extra: dict | None = None) -> dict:
    faces = result.summary.faces
    data = {"kind": kind, "workers": workers, "images": len(result.jobs), "faces": faces, "wall_s": round(wall, 3),
            "faces_per_s": round(faces / wall, 3), "failed": result.failed}
    data.update(extra or {})
    print(json.dumps(data), flush=True)
    return data


def measure_devices(folder: Path, settings: EnhanceSettings, tune: TuneConfig, device: str, counts: list[int],
                    modes: list[str], work: Path) -> list[dict]:
    from gpen_tune.distributed.devices import DevicePool

    rows = []
    with Pipeline(settings, tune) as pipe:
        pipe.prepare()
        with Stopwatch() as sw:
            result = enhance([folder], work / "plain", pipeline=pipe)
        rows.append(row("plain", 1, result, sw.seconds))
    for mode in modes:
        for n in counts:
            devices = [device] * n if device == "cpu" else [f"cuda:{i}" for i in range(n)]
            with DevicePool(settings, tune, devices=devices, mode=mode) as pool:
                pool.prepare()
                with Stopwatch() as sw:
                    result = enhance([folder], work / f"devices-{mode}{n}", pipeline=pool)
                rows.append(row(f"devices-{mode}", n, result, sw.seconds, {"per_device": pool.device_summary()}))
    return rows


def measure_ray(folder: Path, settings: EnhanceSettings, tune: TuneConfig, device: str, counts: list[int],
                work: Path, cpus: int) -> list[dict]:
    import ray

    from gpen_tune.distributed.ray_data import RayOptions, ray_enhance

    rows = []
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        for n in counts:
            first: list[float] = []
            with Stopwatch() as sw:
                options = RayOptions(concurrency=n, num_gpus_per_actor=0 if device == "cpu" else 1,
                                     cpus_per_actor=0.5 if device == "cpu" else 1.0)
                result = ray_enhance([folder], work / f"ray{n}", settings, tune, options=options,
                                     on_result=lambda _job, seen=first: seen or seen.append(sw.elapsed()))
            rows.append(row("ray", n, result, sw.seconds, {"first_result_s": round(first[0], 3) if first else None}))
    finally:
        ray.shutdown()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu (stand-in devices) or cuda")
    ap.add_argument("--workers", default="1,2", help="device counts for --devices")
    ap.add_argument("--modes", default="thread,process", help="DevicePool modes to measure")
    ap.add_argument("--ray-actors", default="1,2", help="restore actor counts for Ray ('' to skip)")
    ap.add_argument("--images", type=int, default=6)
    ap.add_argument("--faces", type=int, default=2, help="faces per mosaic")
    ap.add_argument("--model", default="GPEN-BFR-256")
    ap.add_argument("--weights", default=None, help="a checkpoint or registry name (default: synthetic)")
    ap.add_argument("--preset", default=None, help="tune preset (default: none on cpu, speed on cuda)")
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="CPUs of the local Ray")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpen-tune-scaling-") as tmp:
        work = Path(tmp)
        write_folder(work / "in", args.images, args.faces)
        weights = args.weights or official_checkpoint(args.model, work)
        settings = EnhanceSettings(model=args.model, weights=weights, detector="mtcnn", device=args.device)
        name = args.preset or ("speed" if args.device == "cuda" else None)
        tune = resolve_preset(name, args.device)[1] if name else TuneConfig()
        rows = measure_devices(work / "in", settings, tune, args.device, [int(n) for n in args.workers.split(",")],
                               args.modes.split(","), work)
        if args.ray_actors:
            rows += measure_ray(work / "in", settings, tune, args.device,
                                [int(n) for n in args.ray_actors.split(",")], work, args.cpus)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    record = {"command": "python benchmarks/scaling.py " + shlex.join(sys.argv[1:]), "utc": stamp,
              "device": args.device, "cpus": os.cpu_count(), "model": args.model, "images": args.images,
              "faces_per_image": args.faces, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"scaling_{stamp}_{args.device}.json"
    path.write_text(json.dumps(record, indent=1))
    print(path)


if __name__ == "__main__":
    main()
