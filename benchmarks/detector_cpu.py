"""The MTCNN detector on the CPU, as the serial path runs it: ms per image by torch thread count, against its
former forms, one process, forms interleaved; and whether each form finds the same faces to the bit. The former
forms: max pooling by ATen's `max_pool2d` (which always computes the argmax indices too), and the NMS's greedy pass
with one IoU pass per kept box (`gpen_tune.ops.nms.greedy_nms` now computes the IoUs of many boxes at once).

    python benchmarks/detector_cpu.py --image solvay_conference_1927.png --repeats 5
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from results_file import write_result  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.face.detect import init_detector, mtcnn_cpu  # noqa: E402
from gpen_tune.ops.max_pool import MaxPoolCeil  # noqa: E402
from gpen_tune.ops.nms import by_score  # noqa: E402


def with_aten_pools(detector):
    """The detector with its networks' pools as they were: nn.MaxPool2d(ceil_mode=True)."""
    for net in (detector.pnet, detector.rnet, detector.onet):
        for name, layer in list(net.named_children()):
            if isinstance(layer, MaxPoolCeil):
                setattr(net, name, nn.MaxPool2d(layer.kernel, layer.stride, ceil_mode=True))
    return detector


def per_box_greedy_nms(boxes: torch.Tensor, scores: torch.Tensor, iou: float) -> torch.Tensor:
    """The greedy pass as it was: each kept box against the boxes left, one numpy pass per kept box."""
    if boxes.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    order, (x0, y0, x1, y1), area = by_score(boxes, scores)
    zero = area.dtype.type(0)
    left, kept = np.arange(len(order)), []
    while left.size:
        i, rest = left[0], left[1:]
        kept.append(i)
        w = np.maximum(np.minimum(x1[i], x1[rest]) - np.maximum(x0[i], x0[rest]), zero)
        h = np.maximum(np.minimum(y1[i], y1[rest]) - np.maximum(y0[i], y0[rest]), zero)
        inter = w * h
        with np.errstate(invalid="ignore", divide="ignore"):
            over = inter / (area[i] + area[rest] - inter)
        left = rest[~(over.astype(np.float64) > iou)]
    return torch.from_numpy(order[np.array(kept)]).long()


def with_nms(detector, nms):
    """`detector.detect` with the CPU driver's greedy NMS replaced by `nms` for the call."""
    def detect(batch):
        saved, mtcnn_cpu.greedy_nms = mtcnn_cpu.greedy_nms, nms
        try:
            return detector.detect(batch)
        finally:
            mtcnn_cpu.greedy_nms = saved
    return detect


def images(photo: Path | None) -> dict[str, np.ndarray]:
    out = {"astronaut 512x512": samples.astronaut(), "grace_hopper 512x600": samples.grace_hopper(),
           "mosaic of 4 1104x1104": samples.mosaic(4, 0)}
    if photo is not None:
        bgr = cv2.imread(str(photo))
        if bgr is None:
            raise SystemExit(f"{photo}: not an image; pass --image PATH of a photo")
        out[f"{photo.stem} {bgr.shape[1]}x{bgr.shape[0]}"] = np.ascontiguousarray(bgr[..., ::-1])
    return out


def faces(detect, image: np.ndarray) -> np.ndarray:
    found = detect([image])[0]
    return np.array([np.r_[d.box, d.score, np.ravel(d.landmarks)] for d in found])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", type=Path, default=None, help="a group photo to add to the bundled ones")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    current = init_detector("mtcnn", device="cpu", service="inline")
    forms = {"current": current.detect,
             "aten max_pool2d": with_aten_pools(init_detector("mtcnn", device="cpu", service="inline")).detect,
             "per-box NMS pass": with_nms(current, per_box_greedy_nms)}
    pics = images(args.image)
    saved = torch.get_num_threads()
    rows = []
    same: dict[str, bool] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, image in pics.items():
            ms: dict[str, list[float]] = {form: [] for form in forms}
            found = {form: faces(detect, image) for form, detect in forms.items()}   # warm-up; to compare
            for _ in range(args.repeats):
                for form, detect in forms.items():
                    t = time.perf_counter()
                    detect([image])
                    ms[form].append((time.perf_counter() - t) * 1000)
            a = found["current"]
            same[f"{name}, {threads} threads"] = all(b.shape == a.shape and np.array_equal(a, b)
                                                    for b in found.values())
            row = {"image": name, "threads": threads, "faces": len(a),
                   **{f"{form} ms": round(statistics.median(v), 1) for form, v in ms.items()}}
            rows.append(row)
            print(row, flush=True)
    torch.set_num_threads(saved)
    path = write_result(args.out, "detector_cpu", {
        "benchmark": "detector_cpu", "command": "python " + " ".join(sys.argv), "rows": rows,
        "same_faces_to_the_bit": same, "repeats": args.repeats, "median": "of the repeats, forms interleaved",
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
        "load_average_end": os.getloadavg()})
    print(path)


if __name__ == "__main__":
    main()
