"""The host side of one generator call on CUDA, the crops into the staging buffer and the results out of it
(`gpen_tune.restore.staging.gather_rows` / `split_rows`), against the per-crop copies they replaced, alone and
beside Python threads that only hold the GIL (as a server's other threads do under load). CPU only: the buffers are
plain host tensors (pinned ones behave the same here), no GPU is touched.

    python benchmarks/staging_gil.py [--size 512] [--batches 8,16] [--spinners 0,1,2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402
from timing import gil_holders  # noqa: E402

from gpen_tune.pipeline.threads import SWITCH_INTERVAL_S  # noqa: E402
from gpen_tune.restore.staging import gather_rows, split_rows  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def per_crop(crops: list[np.ndarray], inputs: torch.Tensor, outputs: torch.Tensor) -> list[np.ndarray]:
    """What the staging did before: one numpy copy per crop in, one torch index and numpy copy per crop out."""
    view = inputs.numpy()
    for i, c in enumerate(crops):
        view[i] = c
    return [outputs[i].numpy().copy() for i in range(len(crops))]


def one_call(crops: list[np.ndarray], inputs: torch.Tensor, outputs: torch.Tensor) -> list[np.ndarray]:
    gather_rows(crops, inputs)
    return split_rows(outputs, len(crops))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batches", default="8,16")
    ap.add_argument("--spinners", default="0,1,2")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="A/B rounds (each variant once per round, alternating)")
    ap.add_argument("--torch-threads", type=int, default=None, help="torch's intra-op threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    sys.setswitchinterval(SWITCH_INTERVAL_S)                      # as the service and the threaded scheduler set it
    rng = np.random.default_rng(0)
    top = max(int(b) for b in args.batches.split(","))
    crops = [rng.integers(0, 255, (args.size, args.size, 3), np.uint8) for _ in range(top)]
    inputs = torch.empty((top, args.size, args.size, 3), dtype=torch.uint8)
    outputs = torch.from_numpy(np.stack(crops))
    variants = {"per_crop": per_crop, "one_call": one_call}
    rows = []
    for spinners in (int(s) for s in args.spinners.split(",")):
        with gil_holders(spinners):
            for n in (int(b) for b in args.batches.split(",")):
                for r in range(args.rounds):
                    for name, fn in (variants.items() if r % 2 == 0 else reversed(variants.items())):
                        times = []
                        for _ in range(args.repeats):
                            t0 = time.perf_counter()
                            got = fn(crops[:n], inputs, outputs)
                            times.append(time.perf_counter() - t0)
                        assert len(got) == n and np.array_equal(got[-1], crops[n - 1])
                        ms = statistics.median(times) * 1000
                        rows.append({"variant": name, "spinning_threads": spinners, "batch": n, "round": r,
                                     "ms_median": round(ms, 3)})
                        print(f"{name:9s} {spinners} spinning, batch {n:2d}, round {r}: {ms:.3f} ms", flush=True)
    result = {"benchmark": "staging_gil", "command": shlex.join(["python", "benchmarks/staging_gil.py", *sys.argv[1:]]),
              "size": args.size, "switch_interval_s": SWITCH_INTERVAL_S, "torch_threads": torch.get_num_threads(),
              "rows": rows}
    print(write_result(args.out, "staging_gil_cpu", result))


if __name__ == "__main__":
    main()
