"""Probe: JPEG decode/encode of the throughput folder's photos on the CPU (cv2, 1 and N threads) vs the GPU (nvJPEG
through torchvision.io), to decide whether the folder pipeline should decode and encode on the GPU.

Same files as benchmarks/throughput.py (its build_folder, 64 images). Reports images/s for each path and the max
abs pixel difference of the GPU decode vs cv2's. No assertions on timing.

    PYTHONPATH=$PWD python3 benchmarks/jpeg_probe.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from throughput import build_folder  # noqa: E402


def rate(fn, n_items: int, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return n_items / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    import torchvision
    from torchvision.io import decode_jpeg, encode_jpeg

    res: dict = {"benchmark": "jpeg_probe", "command": "python3 " + shlex.join(sys.argv),
                 "date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                 "torch": torch.__version__, "torchvision": torchvision.__version__, "opencv": cv2.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        build_folder(folder, args.images, tiny=False)
        blobs = [p.read_bytes() for p in sorted(folder.glob("*.jpg"))]
    arrays = [np.frombuffer(b, np.uint8) for b in blobs]
    pixels = sum(cv2.imdecode(a, cv2.IMREAD_COLOR).size // 3 for a in arrays)
    res["images"], res["megapixels"] = len(blobs), round(pixels / 1e6, 1)

    def cpu_decode_serial():
        for a in arrays:
            cv2.imdecode(a, cv2.IMREAD_COLOR)

    pool = ThreadPoolExecutor(args.threads)

    def cpu_decode_threads():
        list(pool.map(lambda a: cv2.imdecode(a, cv2.IMREAD_COLOR), arrays))

    res["cpu_decode_1thread_img_s"] = round(rate(cpu_decode_serial, len(arrays)), 1)
    res[f"cpu_decode_{args.threads}threads_img_s"] = round(rate(cpu_decode_threads, len(arrays)), 1)
    tensors = [torch.from_numpy(a.copy()) for a in arrays]
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        for bs in (1, 8, 32):
            def gpu_decode(bs=bs):
                for i in range(0, len(tensors), bs):
                    decode_jpeg(tensors[i:i + bs], device=dev)
                torch.cuda.synchronize()
            try:
                gpu_decode()
                res[f"gpu_decode_bs{bs}_img_s"] = round(rate(gpu_decode, len(tensors)), 1)
            except Exception as exc:  # noqa: BLE001 - a probe reports what fails
                res[f"gpu_decode_bs{bs}_error"] = f"{type(exc).__name__}: {exc}"[:300]
        try:
            g = decode_jpeg(tensors[:8], device=dev)
            diffs = [float((gi.permute(1, 2, 0).cpu().numpy()[..., ::-1].astype(np.int16)
                            - cv2.imdecode(a, cv2.IMREAD_COLOR).astype(np.int16)).__abs__().max())
                     for gi, a in zip(g, arrays[:8], strict=True)]
            res["gpu_vs_cv2_decode_max_abs"] = max(diffs)
            imgs = [gi.contiguous() for gi in g]

            def gpu_encode():
                encode_jpeg(imgs, quality=95)
                torch.cuda.synchronize()
            gpu_encode()
            res["gpu_encode_bs8_img_s"] = round(rate(gpu_encode, len(imgs)), 1)
            host = [gi.permute(1, 2, 0).cpu().numpy()[..., ::-1].copy() for gi in g]

            def cpu_encode():
                for h in host:
                    cv2.imencode(".jpg", h, [cv2.IMWRITE_JPEG_QUALITY, 95])
            res["cpu_encode_1thread_img_s"] = round(rate(cpu_encode, len(host)), 1)
        except Exception as exc:  # noqa: BLE001
            res["gpu_encode_error"] = f"{type(exc).__name__}: {exc}"[:300]
    print(json.dumps(res, indent=1))
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    (args.out / f"{stamp}_jpeg_probe.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
