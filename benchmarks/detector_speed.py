"""MTCNN detection speed: facenet-pytorch's driver vs our batched driver, same networks, same real photos.

Photos: astronaut, grace hopper, mosaics of them, and upscaled copies, each shrunk to at most --long-side (what the
pipeline's detector does with det_size=1024). Two batch kinds:
  * mixed: the photos at their own sizes. facenet's driver only takes same-size batches, so it gets one call per
    size group (what MTCNNDetector did before the batched driver); ours gets the whole batch in one call.
  * same:  every photo letterboxed onto a --long-side square, so both drivers get the whole batch in one call.
Counts of faces scoring >= 0.9 are compared per image (they must agree). No assertions on timing.

    # CUDA (H200):
    PYTHONPATH=$PWD python3 benchmarks/detector_speed.py --device cuda --batch 1,8,32 --repeats 5 --out results/det
    # CPU smoke run:
    PYTHONPATH=$PWD python benchmarks/detector_speed.py --device cpu --batch 1,4 --repeats 1 --long-side 512 \
        --out /tmp/det
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np
import torch
from timing import Stopwatch, sync

from gpen_tune.face import samples
from gpen_tune.face.detect import DEFAULT_THRESHOLD, MTCNN_MIN_FACE, MTCNN_PYRAMID_FACTOR, MTCNN_STAGE_THRESHOLDS
from gpen_tune.face.detect.mtcnn_batched import detect_mtcnn_batched
from gpen_tune.face.detect.mtcnn_fixed import FixedCanvasPNet
from gpen_tune.ops import area_resize, nms

GREY = 128


def photo_pool(long_side: int) -> list[tuple[str, np.ndarray]]:
    """(name, RGB uint8) real photos, each at most `long_side` on its long side."""
    astro, grace = samples.astronaut(), samples.grace_hopper()
    raw = [("astronaut", astro), ("grace_hopper", grace),
           ("astronaut_up", _fit(astro, 1024, up=True)), ("grace_hopper_up", _fit(grace, 1024, up=True))]
    for n, seed in ((6, 0), (4, 2), (9, 4), (6, 1), (12, 5), (4, 3)):
        raw.append((f"mosaic{n}_s{seed}", samples.mosaic(n, seed)))
    return [(name, _fit(img, long_side)) for name, img in raw]


def _fit(img: np.ndarray, long_side: int, up: bool = False) -> np.ndarray:
    k = long_side / max(img.shape[:2])
    if k >= 1 and not up:
        return img
    size = (max(1, round(img.shape[1] * k)), max(1, round(img.shape[0] * k)))
    return cv2.resize(img, size, interpolation=cv2.INTER_CUBIC if k > 1 else cv2.INTER_AREA)


def letterbox(img: np.ndarray, side: int) -> np.ndarray:
    out = np.full((side, side, 3), GREY, np.uint8)
    img = _fit(img, side)
    out[:img.shape[0], :img.shape[1]] = img
    return out


def facenet_driver(batch: list[np.ndarray], nets, device) -> list[int]:
    """facenet's detect_face, one call per group of same-size images; faces >= threshold per image."""
    from facenet_pytorch.models.utils.detect_face import detect_face

    counts = [0] * len(batch)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, img in enumerate(batch):
        groups.setdefault(img.shape[:2], []).append(i)
    for idx in groups.values():
        boxes, _ = detect_face(np.stack([batch[i] for i in idx]), MTCNN_MIN_FACE, *nets,
                               list(MTCNN_STAGE_THRESHOLDS), MTCNN_PYRAMID_FACTOR, device)
        for i, b in zip(idx, boxes, strict=True):
            b = np.asarray(b, dtype=np.float64).reshape(-1, 5)
            counts[i] = int((b[:, 4] >= DEFAULT_THRESHOLD).sum())
    return counts


def batched_driver(nms_impl: str, area_impl: str):
    """Our batched driver with these NMS / area-resize implementations (--nms, --area)."""

    def driver(batch: list[np.ndarray], nets, device) -> list[int]:
        found = detect_mtcnn_batched(batch, *nets, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR,
                                     device, nms=nms_impl, area=area_impl)
        return [int((s >= DEFAULT_THRESHOLD).sum()) for _, s, _ in found]

    return driver


def graphed_driver(side: int, pnet, nms_impl: str, area_impl: str):
    """The batched driver with its P-Net stage replayed from CUDA graphs (FixedCanvasPNet, canvas = --long-side)."""
    fixed = FixedCanvasPNet(pnet, side, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS[0], MTCNN_PYRAMID_FACTOR,
                            area=area_impl)

    def driver(batch: list[np.ndarray], nets, device) -> list[int]:
        found = detect_mtcnn_batched(batch, *nets, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS, MTCNN_PYRAMID_FACTOR,
                                     device, fixed=fixed, nms=nms_impl, area=area_impl)
        return [int((s >= DEFAULT_THRESHOLD).sum()) for _, s, _ in found]

    return driver


def measure(driver, batch, nets, device, repeats: int) -> dict:
    with torch.inference_mode():
        counts = driver(batch, nets, device)                 # warm-up (cuDNN autotune, allocator)
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        with Stopwatch(device) as sw:
            for _ in range(repeats):
                driver(batch, nets, device)
        dt, cpu = sw.seconds, sw.thread_cpu_s
    out = {"images_per_s": round(len(batch) * repeats / dt, 2), "s_per_batch": round(dt / repeats, 4),
           "host_cpu_s_per_batch": round(cpu / repeats, 4), "faces": counts}
    if device.type == "cuda":
        out["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return out


def environment(device: torch.device) -> dict:
    import torchvision

    env = {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
           "device": str(device), "cpu_threads": torch.get_num_threads(), "host": platform.node()}
    try:
        from importlib.metadata import version

        env["facenet_pytorch"] = version("facenet-pytorch")
    except Exception:  # noqa: BLE001 - a missing distribution record is not worth failing over
        env["facenet_pytorch"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per batch (after one warm-up call)")
    ap.add_argument("--long-side", type=int, default=1024, help="photos are shrunk to this long side")
    ap.add_argument("--kinds", default="mixed,same", help="batch kinds: mixed (own sizes), same (letterboxed)")
    ap.add_argument("--skip-facenet", action="store_true", help="time only the batched driver")
    ap.add_argument("--skip-graphs", action="store_true", help="CUDA: skip the P-Net CUDA-graph variant")
    ap.add_argument("--nms", choices=nms.IMPLS, default="auto",
                    help="our driver's NMS: auto (the Triton kernel where it runs), torch (torchvision), triton")
    ap.add_argument("--area", choices=area_resize.IMPLS, default="auto",
                    help="our driver's area resize: auto (the Triton kernel where it runs), torch, triton")
    ap.add_argument("--out", type=Path, default=None, help="folder for the JSON result")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu", file=sys.stderr)
        return 2
    from facenet_pytorch.models.mtcnn import ONet, PNet, RNet

    nets = tuple(n().to(device).eval() for n in (PNet, RNet, ONet))
    pool = photo_pool(args.long_side)
    graphed = (graphed_driver(args.long_side, nets[0], args.nms, args.area)
               if device.type == "cuda" and not args.skip_graphs else None)
    sizes = [int(b) for b in args.batch.split(",") if b.strip()]
    result = {"command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "environment": environment(device), "long_side": args.long_side, "repeats": args.repeats,
              "nms": args.nms, "area": args.area,
              "photos": [[name, list(img.shape[:2])] for name, img in pool], "runs": []}
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        images = [img for _, img in pool]
        if kind == "same":
            images = [letterbox(img, args.long_side) for img in images]
        for b in sizes:
            batch = [images[i % len(images)] for i in range(b)]
            run = {"kind": kind, "batch": b}
            drivers = [("batched", batched_driver(args.nms, args.area))]
            if not args.skip_facenet:
                drivers.append(("facenet", facenet_driver))
            if graphed is not None:
                drivers.append(("batched_graphs", graphed))
            for name, driver in drivers:
                run[name] = measure(driver, batch, nets, device, args.repeats)
                print(f"{kind:5s} batch {b:3d} {name:8s} {run[name]['images_per_s']:8.2f} images/s", flush=True)
            if "batched_graphs" in run:
                run["graphs_same_counts"] = run["batched"]["faces"] == run["batched_graphs"]["faces"]
                run["graphs_speedup"] = round(run["batched_graphs"]["images_per_s"] / run["batched"]["images_per_s"],
                                              2)
            if "facenet" in run:
                run["same_counts"] = run["batched"]["faces"] == run["facenet"]["faces"]
                run["speedup"] = round(run["batched"]["images_per_s"] / run["facenet"]["images_per_s"], 2)
            result["runs"].append(run)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        path = args.out / f"{stamp}_detector_speed_{device.type}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
