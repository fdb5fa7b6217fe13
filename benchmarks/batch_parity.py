"""Serial vs pipelined outputs on the CPU: where they differ and by how much (no timing).

The figures behind tests/pipeline/test_batch_parity.py's bounds, on the bundled photos (astronaut, grace_hopper,
three mosaics, a face-free image: 15 faces), the real MTCNN and a synthetic GPEN (--size, --narrow), in fp32 and in
the CPU preset (fused generator, bf16):
* crops: each aligned face crop restored alone vs inside batches of 2 / 4 / 8 (torch threads 1 and 2), and the
  first op whose output for the face differs between batch 1 and batch 4 (a dispatch-level trace);
* detector: each image alone through MTCNN with 2 torch threads, then 1 (what a threaded CPU run gives torch);
* pipeline: serial vs threaded with the serial path's torch threads ("pinned") and with the threaded default
  ("default"): landmark shift, restored-crop and image differences, the images also after a JPEG round trip
  (OpenCV's default quality 95), as a folder run that writes JPEG compares them.

    python benchmarks/batch_parity.py      # benchmarks/results/<date>_batch_parity.json
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from results_file import write_result  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model.configs import GPENConfig  # noqa: E402
from gpen_tune.model.io import to_model_input  # noqa: E402
from gpen_tune.pipeline import ArraySource, EnhanceSettings, Pipeline, SchedulerConfig  # noqa: E402
from gpen_tune.tune import TuneConfig  # noqa: E402
from gpen_tune.tune.options import PRESETS  # noqa: E402

TUNES = {"fp32": TuneConfig(), "bf16": PRESETS["cpu"]}


class Kept:
    """A sink keeping each job's faces, restored crops and result (the scheduler frees them after writing)."""

    ordered = False

    def __init__(self):
        self.faces, self.restored, self.results = {}, {}, {}

    def write(self, job):
        self.faces[job.index] = list(job.faces)
        self.restored[job.index] = [f.restored.copy() for f in job.faces]
        self.results[job.index] = job.result.rgb.copy()


class Trace(TorchDispatchMode):
    """Every aten op's (name, output) of one forward."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, torch.Tensor]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() >= 1:
            self.ops.append((str(func), out.detach().clone()))
        return out


def stats(d: np.ndarray) -> dict:
    return {"max": int(d.max()) if d.size else 0, "mean": round(float(d.mean()), 5) if d.size else 0.0}


def diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.astype(np.int16) - b.astype(np.int16))


def first_divergence(forward, crops: np.ndarray, n: int) -> dict | None:
    """The first op whose output for face 0 differs between a batch of 1 and a batch of n."""
    x = to_model_input(torch.from_numpy(crops[:n]), torch.float32)
    traces = []
    with torch.inference_mode():
        for batch in (x[:1], x):
            with Trace() as t:
                forward(batch)
            traces.append(t.ops)
    for (name, a), (_, b) in zip(*traces, strict=False):
        if a.shape[0] == 1 and b.shape[0] == n and a.shape[1:] == b.shape[1:] and not torch.equal(a, b[:1]):
            rel = float((a.float() - b[:1].float()).abs().max() / a.float().abs().max().clamp_min(1e-30))
            return {"op": name, "shape_batch_1": list(a.shape), "dtype": str(a.dtype), "max_rel": rel}
    return None


def crop_level(restorer, crops: np.ndarray) -> dict:
    out = {}
    before = torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        alone = np.stack([restorer.restore_crops([c])[0] for c in crops[:8]])
        row = {f"batch_{n}": stats(diff(restorer.restore_crops(list(crops[:n])), alone[:n])) for n in (2, 4, 8)}
        rev = restorer.restore_crops(list(crops[:8][::-1]))[::-1]
        row["batch_8_reversed_equal"] = bool(np.array_equal(rev, restorer.restore_crops(list(crops[:8]))))
        out[f"threads_{threads}"] = row
        out.setdefault("alone", {})[threads] = alone
    torch.set_num_threads(before)
    alone = out.pop("alone")
    out["batch_1_threads_1_vs_2"] = stats(diff(alone[1], alone[2]))
    return out


def detector_threads(folder: list[np.ndarray]) -> dict:
    """Each image detected alone with 2 torch threads, then with 1: the largest landmark shift (px) per image."""
    from gpen_tune.face.detect import init_detector

    det = init_detector("mtcnn", device="cpu")
    before = torch.get_num_threads()
    found = {}
    for threads in (2, 1):
        torch.set_num_threads(threads)
        found[threads] = [det.detect([img])[0] for img in folder]
    torch.set_num_threads(before)
    det.close()
    return {"landmark_shift_px_threads_2_vs_1": [
        max((float(np.abs(a.landmarks - b.landmarks).max()) for a, b in zip(x, y, strict=True)), default=0.0)
        for x, y in zip(found[2], found[1], strict=True)]}


def pipeline_level(pipe, folder: list[np.ndarray]) -> dict:
    sinks = {"serial": Kept()}
    pipe.run(ArraySource(folder), sinks["serial"], serial=True)
    out: dict = {"threads_serial": torch.get_num_threads()}
    for name, threads in (("pinned", torch.get_num_threads()), ("default", None)):
        sinks[name] = Kept()
        cfg = SchedulerConfig(workers=2, detect_batch=3, torch_threads=threads)
        summary = pipe.run(ArraySource(folder), sinks[name], config=cfg)
        s, p = sinks["serial"], sinks[name]
        rows = []
        for i in range(len(folder)):
            pairs = list(zip(s.faces[i], p.faces[i], strict=True))
            shift = max((float(np.abs(a.detection.landmarks - b.detection.landmarks).max()) for a, b in pairs),
                        default=0.0)
            crops = [stats(diff(a, b)) for a, b in zip(s.restored[i], p.restored[i], strict=True)]
            jpeg = [cv2.imdecode(cv2.imencode(".jpg", r[i][..., ::-1])[1], cv2.IMREAD_COLOR)
                    for r in (s.results, p.results)]
            rows.append({"faces": len(pairs), "landmark_shift_px": shift,
                         "affines_equal": all(np.array_equal(a.affine, b.affine) for a, b in pairs),
                         "restored_crops": crops, "image_png": stats(diff(s.results[i], p.results[i])),
                         "image_jpeg_q95": stats(diff(*jpeg))})
        out[name] = {"torch_threads": threads or cfg.cpu_threads(), "batch_sizes": summary.stages["batch_sizes"],
                     "images": rows}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--narrow", type=float, default=0.25)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    folder = [samples.astronaut(), samples.grace_hopper(), samples.mosaic(4, 0),
              np.full((96, 128, 3), 90, np.uint8), samples.mosaic(6, 1), samples.mosaic(3, 2)]
    crops = samples.aligned_face_crops(args.size, n=8)
    base = load_model("synthetic", model=GPENConfig(args.size, narrow=args.narrow))
    result: dict = {"benchmark": "batch_parity", "command": "python benchmarks/" + " ".join(
        [Path(sys.argv[0]).name, *sys.argv[1:]]), "model": {"size": args.size, "narrow": args.narrow,
                                                             "weights": "synthetic"},
                    "torch": torch.__version__, "loadavg_before": os.getloadavg()}
    result["detector"] = detector_threads(folder)
    for precision, tune in TUNES.items():
        pipe = Pipeline(EnhanceSettings(device="cpu", detector="mtcnn", batch_size=8), tune,
                        model=copy.deepcopy(base))
        restorer = pipe.restorer
        result[precision] = {"tune": str(restorer.effective), "crops": crop_level(restorer, crops),
                             "first_divergent_op_batch_4": first_divergence(restorer.forward, crops, 4),
                             "pipeline": pipeline_level(pipe, folder)}
        pipe.close()
    result["loadavg_after"] = os.getloadavg()
    path = write_result(args.out, "batch_parity", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
