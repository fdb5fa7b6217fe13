"""The detector's P-Net plans: what a plan's first (eager) batch costs per batch bucket, with the convolutions on the
whole bucket per call (the library's form) against at most 4 or 8 images per call (so that every larger bucket
meets the same convolution shapes), and what a replay costs.

Why: a 1080p video's detector thread spent half its samples in the first batch of each new plan, mostly inside
convolution calls (cuDNN sets up every new convolution shape once per process). Each variant runs in its own fresh
process on the 1,024 x 576 canvas of a 1080p frame at det_size 1,024: buckets 1, 4, 8, 16, 32 in turn, each
bucket's first batch timed (eager, the set-up included), then its steady replay (CUDA graph) timed.
Found (H100, 20261206-135959_pnet_shapes.json): the capped forms save 30-100 ms on a new bucket's first batch but
capture slower (4 images: 290 ms at bucket 32 against 61) and replay slower (27.0 against 19.1 ms at bucket 32);
the first batch of the first plan costs 0.8-1.0 s in every form. Not kept.

    python benchmarks/pnet_shapes.py            # benchmarks/results/<date>_pnet_shapes.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from results_file import write_result  # noqa: E402

BUCKETS = (1, 4, 8, 16, 32)
VARIANTS = {"whole_bucket": 1 << 30, "images_per_conv_4": 4, "images_per_conv_8": 8}


def child(images_per_conv: int) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT))
    from gpen_tune.face.detect.mtcnn import MTCNN_MIN_FACE, MTCNN_PYRAMID_FACTOR, MTCNN_STAGE_THRESHOLDS, MTCNNDetector
    from gpen_tune.face.detect.mtcnn_fixed import FixedCanvasPNet

    det = MTCNNDetector("cuda", det_size=1024)
    from gpen_tune.face.detect.mtcnn_batched import PNET_MAX_PIXELS, _Chunk

    class CappedPNet(FixedCanvasPNet):
        """The plan with at most `images_per_conv` images per P-Net call (the variant measured, not kept)."""

        def _chunks(self, bucket, h, w, scales):
            budget = PNET_MAX_PIXELS * 4 // self.dtype.itemsize
            chunks, n = [], 0
            for scale in scales:
                level_h, level_w = int(h * scale + 1), int(w * scale + 1)
                per_call = max(1, min(images_per_conv, budget // (level_h * level_w)))
                for start in range(0, bucket, per_call):
                    k = min(per_call, bucket - start)
                    chunks.append(_Chunk(scale, n, n + k, level_h, level_w))
                    n += k
            return chunks

    fixed = CappedPNet(det.pnet, 1024, MTCNN_MIN_FACE, MTCNN_STAGE_THRESHOLDS[0], MTCNN_PYRAMID_FACTOR,
                       max_batch=32)
    frame = np.random.default_rng(0).integers(0, 255, (576, 1024, 3), dtype=np.uint8)
    torch.nn.functional.conv2d(torch.zeros(1, 3, 8, 8, device="cuda"), torch.zeros(1, 3, 3, 3, device="cuda"))
    torch.cuda.synchronize()
    rows = []
    for bucket in BUCKETS:
        images = [frame] * bucket
        t = time.perf_counter()
        maps = fixed(images)
        maps.mask.nonzero()
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        t = time.perf_counter()
        fixed(images)                                           # second batch: captured (warm-ups included)
        torch.cuda.synchronize()
        capture = time.perf_counter() - t
        steady = []
        for _ in range(5):
            t = time.perf_counter()
            fixed(images).mask.nonzero()
            torch.cuda.synchronize()
            steady.append(time.perf_counter() - t)
        rows.append({"bucket": bucket, "first_batch_ms": round(1000 * first, 2),
                     "second_batch_capture_ms": round(1000 * capture, 2),
                     "replay_ms": round(1000 * float(np.median(steady)), 3)})
    return {"images_per_conv": images_per_conv, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per variant, interleaved (A/B/A/B)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return 0
    runs = []
    for r in range(args.rounds):
        for name, k in VARIANTS.items():
            out = subprocess.run([sys.executable, __file__, "--child", str(k)], capture_output=True, text=True,
                                 check=True).stdout.strip().splitlines()[-1]
            runs.append({"round": r + 1, "variant": name, **json.loads(out)})
            print(json.dumps(runs[-1]), flush=True)
    import torch
    result = {"benchmark": "pnet_shapes", "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "canvas": [576, 1024], "runs": runs}
    print(f"wrote {write_result(args.out, 'pnet_shapes', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
