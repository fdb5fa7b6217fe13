"""The service's generator call (`Steps.restorer.submit(...).result()`, GPEN-BFR-512, `--preset speed`, batch 64
limit, every bucket warmed as the server does) timed alone and beside 1, 2 and 4 Python threads that hold the
GIL (pure-Python loops), as the server's other threads do under load, at each GIL hand-over interval asked for
(the server's by default). A call whose time grows with the spinning threads spends it waiting for the GIL, not
on the GPU; the spinning threads' loops per second show what a shorter interval costs them.

    python benchmarks/generator_gil.py [--batches 8,16] [--intervals-us 200,50] [--repeats 15] [--code DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402
from timing import gil_holders  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--spinners", default="0,1,2,4,0")
    ap.add_argument("--intervals-us", default=None, help="GIL hand-over intervals in microseconds (default: the "
                    "server's)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--code", type=Path, default=None, help="the checkout whose gpen_tune is timed (default: this "
                    "one): an A/B of a change to the restorer")
    ap.add_argument("--tag", default="", help="appended to the JSON's name")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    code = (args.code or REPO).resolve()
    sys.path.insert(0, str(code))

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
    intervals = ([int(u) * 1e-6 for u in args.intervals_us.split(",")] if args.intervals_us
                 else [steps.switch_interval()])                 # the server's
    rows = []
    for interval in intervals:
        sys.setswitchinterval(interval)
        for spinners in (int(s) for s in args.spinners.split(",")):
            with gil_holders(spinners) as loops:
                for n in (int(b) for b in args.batches.split(",")):
                    times = []
                    loops[0], start = 0, time.perf_counter()
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        steps.restorer.submit([face] * n).result()
                        times.append(time.perf_counter() - t)
                    spin_rate = loops[0] / (time.perf_counter() - start)
                    ms = statistics.median(times) * 1000
                    rows.append({"switch_interval_us": round(interval * 1e6), "spinning_threads": spinners,
                                 "batch": n, "call_ms_median": round(ms, 2),
                                 "call_ms_min": round(min(times) * 1000, 2),
                                 "spinner_kloops_per_s": round(spin_rate / 1000, 2)})
                    print(f"interval {interval * 1e6:.0f} us, {spinners} spinning threads, batch {n}: {ms:.2f} ms "
                          f"per call; spinners {spin_rate / 1000:.1f} k loops/s", flush=True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    result = {"benchmark": "generator_gil", "command": shlex.join(["python", "benchmarks/generator_gil.py",
                                                                   *sys.argv[1:]]),
              "device": device, "code": str(code), "server_switch_interval_s": steps.switch_interval(),
              "warm_up_s": round(warm_s, 2), "rows": rows}
    name = f"generator_gil_{args.device.split(':')[0]}" + (f"_{args.tag}" if args.tag else "")
    print(write_result(args.out, name, result))


if __name__ == "__main__":
    main()
