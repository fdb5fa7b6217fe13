"""The service's generator call (`Steps.restorer.submit(...).result()`, GPEN-BFR-512, `--preset speed`, batch 64
limit, every padded size warmed as the server does) timed alone and beside 1, 2 and 4 Python threads that hold the
GIL (pure-Python loops), as the server's other threads do under load. A call whose time grows with the spinning
threads spends it waiting for the GIL, not on the GPU.

    python benchmarks/generator_gil.py [--batches 8,16] [--repeats 15] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--spinners", default="0,1,2,4,0")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()

    import torch

    from gpen_tune.pipeline.settings import EnhanceSettings
    from gpen_tune.serve.steps import Steps
    from gpen_tune.tune.options import PRESETS

    settings = EnhanceSettings(model=args.model, weights="synthetic", detector="mtcnn", device=args.device,
                               batch_size=64)
    steps = Steps.build(settings, PRESETS["speed"], notify=lambda _: None)
    t0 = time.perf_counter()
    steps.warm_up(detector=False)
    warm_s = time.perf_counter() - t0
    size = steps.pipeline.size
    face = np.random.default_rng(0).integers(0, 255, (size, size, 3), np.uint8)
    running = threading.Event()

    def spin() -> None:
        x = 0
        while running.is_set():
            for i in range(1000):
                x += i

    rows = []
    sys.setswitchinterval(steps.switch_interval())            # the server's
    for spinners in (int(s) for s in args.spinners.split(",")):
        running.set()
        threads = [threading.Thread(target=spin, daemon=True) for _ in range(spinners)]
        for t in threads:
            t.start()
        for n in (int(b) for b in args.batches.split(",")):
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                steps.restorer.submit([face] * n).result()
                times.append(time.perf_counter() - t)
            ms = statistics.median(times) * 1000
            rows.append({"spinning_threads": spinners, "batch": n, "call_ms_median": round(ms, 2),
                         "call_ms_min": round(min(times) * 1000, 2)})
            print(f"{spinners} spinning threads, batch {n}: {ms:.2f} ms per call", flush=True)
        running.clear()
        for t in threads:
            t.join()
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"benchmark": "generator_gil", "command": shlex.join(["python", "benchmarks/generator_gil.py",
                                                                   *sys.argv[1:]]),
              "device": device, "switch_interval_s": steps.switch_interval(), "warm_up_s": round(warm_s, 2),
              "rows": rows}
    print(write_result(args.out, f"generator_gil_{args.device.split(':')[0]}", result))


if __name__ == "__main__":
    main()
