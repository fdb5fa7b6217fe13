"""Why is the face detector ~3x slower inside a folder run than alone? One process, same detector, same batches.

In the throughput benchmark the detector thread is busy ~94 % of the pipeline run and does ~75 images/s, against
~290 images/s for the same driver alone (benchmarks/detector_speed.py). Candidates: the GPU (the generator's
batches and the GPU paste share it), the CPU (48 prepare threads decoding JPEGs), the GIL (each of the detector's
~2,000 torch calls per batch runs under the GIL; after every host sync the detector thread must win it back).
This script times the same detector call (batches of --batch real photos shrunk to 1024) under each load alone
and together, reporting wall ms per call and the detector thread's own CPU ms per call (time.thread_time):
wall growing with CPU ms constant = waiting (GPU or GIL); CPU ms growing = CPU contention or more work.

    PYTHONPATH=$PWD python3 benchmarks/detector_contention.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import cv2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from detector_speed import photo_pool  # noqa: E402

from gpen_tune.face.detect import MTCNNDetector  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402


def profile_call(det, images) -> dict:
    """One detector call alone under torch.profiler: wall ms, GPU kernel ms (sum over kernels), kernel count and
    the torch calls made from Python: how much of the call is host work that CUDA graphs could remove."""
    from torch.profiler import ProfilerActivity, profile

    det.detect(images)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        det.detect(images)
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total for e in kernels)
    by_name: dict[str, list] = {}
    for e in kernels:
        row = by_name.setdefault(e.name[:70], [0.0, 0])
        row[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        row[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:12]
    return {"condition": "profile: one call alone", "wall_ms_under_profiler": round(1e3 * wall, 1),
            "gpu_kernel_ms": round(gpu_us / 1e3, 2), "kernels": len(kernels),
            "top_kernels": [{"name": k, "ms": round(v[0] / 1e3, 2), "count": v[1]} for k, v in top],
            "cpu_ops": sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU
                           and e.name.startswith("aten::"))}


def load_before(path: Path):
    """An earlier mtcnn_batched.py as a module of its own (A/B of the driver in one process)."""
    spec = importlib.util.spec_from_file_location("mtcnn_batched_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DECODE_LOOP = """
import sys, time, glob, cv2
cv2.setNumThreads(1)
files = sorted(glob.glob(sys.argv[1] + "/*.jpg"))
data = [open(f, "rb").read() for f in files]
import numpy as np
bufs = [np.frombuffer(d, np.uint8) for d in data]
sleep_s = float(sys.argv[2])
k = 0
while True:
    img = cv2.imdecode(bufs[k % len(bufs)], cv2.IMREAD_COLOR)
    cv2.resize(img, (img.shape[1] // 2, img.shape[0] // 2), interpolation=cv2.INTER_AREA)
    time.sleep(sleep_s)
    k += 1
"""


@contextlib.contextmanager
def process_load(n: int, jpegs: list, sleep_s: float):
    """The same decode + shrink loop as the prepare-like threads, in n small Python processes (own GIL each; they
    import only OpenCV and numpy)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for i, buf in enumerate(jpegs):
            Path(tmp, f"{i}.jpg").write_bytes(buf.tobytes())
        procs = [subprocess.Popen([sys.executable, "-c", _DECODE_LOOP, tmp, str(sleep_s)]) for _ in range(n)]
        time.sleep(2.0)                        # start + first decodes
        try:
            yield
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()


class Load:
    """Background threads that run `work()` until stopped; counts iterations."""

    def __init__(self, name: str, threads: int, work):
        self.name, self.n, self.work = name, threads, work
        self.stop = threading.Event()
        self.iters = 0
        self.threads: list[threading.Thread] = []

    def _loop(self):
        while not self.stop.is_set():
            self.work()
            self.iters += 1

    def __enter__(self):
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.n)]
        for t in self.threads:
            t.start()
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def time_detector(det, batches, calls: int) -> dict:
    wall, cpu = [], []
    for i in range(calls):
        imgs = batches[i % len(batches)]
        t0, c0 = time.perf_counter(), time.thread_time()
        det.detect(imgs)
        wall.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.thread_time() - c0))
    return {"wall_ms": round(statistics.median(wall), 1), "thread_cpu_ms": round(statistics.median(cpu), 1),
            "images_per_s": round(len(batches[0]) / (statistics.median(wall) / 1e3), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=21, help="images per detector call (the pipeline's mean: ~21)")
    ap.add_argument("--calls", type=int, default=12)
    ap.add_argument("--prepare-threads", type=int, default=48)
    ap.add_argument("--before", type=Path, default=None, help="an earlier mtcnn_batched.py: A/B in the same run")
    ap.add_argument("--ab-pnet-graphs", action="store_true",
                    help="A/B in the same run: the detector's P-Net from CUDA graphs (default) vs eager")
    ap.add_argument("--ab-nms-torchvision", action="store_true",
                    help="A/B in the same run: the detector's NMS per group in Triton (default) vs torchvision's")
    ap.add_argument("--gil-split", action="store_true",
                    help="the decode load in 8 / 16 / N threads and in N processes: is the slowdown the GIL?")
    ap.add_argument("--profile", action="store_true", help="also profile one call alone (GPU vs host time)")
    ap.add_argument("--full", action="store_true", help="also the GPU-only conditions and the stream priority")
    ap.add_argument("--prepare-sleep-ms", type=float, default=30.0)
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script only")
    ap.add_argument("--faces", type=int, default=32, help="faces per generator call of the GPU load")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    device = torch.device(args.device)
    cv2.setNumThreads(1)
    pool = [img for _, img in photo_pool(1024)]
    batches = [[pool[(k + j) % len(pool)] for j in range(args.batch)] for k in range(len(pool))]
    det = MTCNNDetector(device=args.device)
    det.detect(batches[0])
    cuda = device.type == "cuda"

    # GPU load: the folder run's generator (preset speed, batch 32) back to back on its own stream
    from gpen_tune.restore import build_restorer
    from gpen_tune.tune import PRESETS

    restorer = build_restorer(load_model("synthetic", model=args.model, device=device), PRESETS["speed"],
                              device=device)
    size = int(args.model.rsplit("-", 1)[-1])
    faces = torch.rand(args.faces, 3, size, size, device=device) * 2 - 1
    gen_stream = torch.cuda.Stream() if cuda else None

    def generate():
        with torch.cuda.stream(gen_stream), torch.inference_mode():
            restorer(faces)
        if cuda:
            gen_stream.synchronize()

    for _ in range(3):
        generate()

    # CPU load: what a prepare thread does besides waiting for the detector (decode a JPEG, shrink it)
    jpegs = [cv2.imencode(".jpg", cv2.resize(img, None, fx=1.6, fy=1.6), [cv2.IMWRITE_JPEG_QUALITY, 95])[1]
             for img in pool]
    counter = iter(range(10**12))

    def prepare_like():
        buf = jpegs[next(counter) % len(jpegs)]
        img = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        cv2.resize(img, (img.shape[1] // 2, img.shape[0] // 2), interpolation=cv2.INTER_AREA)
        time.sleep(args.prepare_sleep_ms / 1e3)   # the rest of a prepare thread's time: waiting for its detections

    gen_s = []

    def generate_with_duty():                     # the generator at ~the folder run's busy fraction (35-40 %)
        t0 = time.perf_counter()
        generate()
        gen_s.append(time.perf_counter() - t0)
        time.sleep(1.7 * gen_s[-1])

    class _Det:
        def __init__(self, priority: int = 0):
            self.stream = torch.cuda.Stream(priority=priority) if cuda else None

        def detect(self, imgs):
            with torch.cuda.stream(self.stream):
                return det.detect(imgs)

    rows = []

    def record(name, d=None, **extra):
        r = {"condition": name, **time_detector(d or _Det(), batches, args.calls), **extra}
        print(json.dumps(r), flush=True)
        rows.append(r)

    before = load_before(args.before) if args.before else None
    import gpen_tune.face.detect.mtcnn_batched as current

    @contextlib.contextmanager
    def driver(label: str):
        """The detector's batched MTCNN driver: this checkout's, or the --before file's (same networks); "eager":
        this checkout's without the P-Net CUDA graphs; "nms_torchvision": the detector's nms="torch"."""
        kept, kept_graphs, kept_nms = current.detect_mtcnn_batched, det.pnet_graphs, det.nms
        if label == "before":
            current.detect_mtcnn_batched = before.detect_mtcnn_batched
        if label == "eager":
            det.pnet_graphs = False
        if label == "nms_torchvision":
            det.set_impls(nms="torch")
        try:
            yield
        finally:
            current.detect_mtcnn_batched, det.pnet_graphs = kept, kept_graphs
            det.set_impls(nms=kept_nms)

    labels = ["after", "before"] if before else ["after"]
    if args.ab_nms_torchvision:
        labels.append("nms_torchvision")
    if args.ab_pnet_graphs:
        labels.append("eager")
        if cuda:
            det.capture_graphs()
    if args.profile and cuda:
        for label in labels:
            with driver(label):
                rows.append({**profile_call(_Det(), batches[0]), "driver": label})
            print(json.dumps(rows[-1]), flush=True)
    for label in labels:
        with driver(label):
            record("alone", driver=label)
    if args.full:
        with Load("generator", 1, generate) as g:
            record("gpu: generator back to back", generator_iters=g.iters)
        with Load("generator", 1, generate) as g:
            record("gpu: generator back to back, detector stream at high priority", _Det(priority=-1),
                   generator_iters=g.iters)
        with Load("generator", 1, generate_with_duty) as g:
            record("gpu: generator ~37 % busy", generator_iters=g.iters)
    for label in labels:
        with driver(label), Load("prepare", args.prepare_threads, prepare_like) as p:
            record(f"cpu: {args.prepare_threads} prepare-like threads", driver=label, prepare_iters=p.iters)
    if args.gil_split:
        # GIL or CPU? The same decode load in threads of this process (sharing the detector's GIL) at several counts,
        # and in processes (own GILs, same CPU work): if only the threads slow the detector, it is the GIL.
        for n in (8, 16, args.prepare_threads):
            with Load("prepare", n, prepare_like) as p:
                record(f"gil split: {n} prepare-like threads", prepare_iters=p.iters)
        with process_load(args.prepare_threads, jpegs, args.prepare_sleep_ms / 1e3):
            record(f"gil split: {args.prepare_threads} prepare-like processes (own GIL each)")
    for label in labels:
        with driver(label), Load("generator", 1, generate_with_duty), Load("prepare", args.prepare_threads,
                                                                           prepare_like):
            record("gpu ~37 % + cpu", driver=label)
    if args.full:
        with Load("generator", 1, generate_with_duty), Load("prepare", args.prepare_threads, prepare_like):
            record("gpu ~37 % + cpu, detector stream at high priority", _Det(priority=-1))
    record("alone (again)")
    record_ = {
        "benchmark": "detector_contention",
        "command": "python3 benchmarks/detector_contention.py " + shlex.join(sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "batch": args.batch, "calls": args.calls, "prepare_threads": args.prepare_threads,
        "pnet_graphs": det.uses_pnet_graphs,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}_detector_contention.json"
    path.write_text(json.dumps(record_, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
