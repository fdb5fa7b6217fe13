"""How many torch calls one MTCNN detection makes, stage by stage, and what they cost beside threads that hold the
GIL: every torch call gives the GIL up and waits to take it back, so under a service's load (many request threads
in one process) a detection costs what its calls number, not what its kernels take.

Runs on the CPU: the batched driver (the GPU's, `mtcnn_batched`, here with the PyTorch twins of its NMS and area
resize; on a GPU those are one Triton launch each and P-Net's stage one CUDA-graph replay, so
`aten_calls_after_pnet` bounds what is left of a GPU call) and the CPU driver (`mtcnn_cpu`). Top-level aten calls
per detection, by stage, and the detection's wall time alone and beside `--beside` threads at the service's GIL
switch interval.

    python benchmarks/detector_ops.py [--beside 0,1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_result  # noqa: E402
from timing import gil_holders  # noqa: E402

from gpen_tune.face import samples  # noqa: E402
from gpen_tune.face.detect import mtcnn_batched, mtcnn_cpu  # noqa: E402
from gpen_tune.face.detect.mtcnn_nets import load_networks  # noqa: E402
from gpen_tune.pipeline.threads import SWITCH_INTERVAL_S  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STAGES = ("_stage1", "_candidates", "_stage2", "_stage3", "_finish")   # the batched driver's methods
# inside the stages, the parts a GPU runs otherwise: the area resize and NMS (PyTorch twins here, one Triton launch
# each there) and R-Net / O-Net themselves (the networks' calls)
PARTS = {"area_resize": "area resize", "grouped_nms": "nms", "_run_chunked": "networks"}


def labelled_stages() -> None:
    """Each stage of the batched driver, and each part above, under a profiler label of its own."""
    def label(owner, name: str, text: str) -> None:
        method = getattr(owner, name)

        def labelled(*args, _method=method, **kwargs):
            with record_function(text):
                return _method(*args, **kwargs)

        setattr(owner, name, labelled)

    for name in STAGES:
        label(mtcnn_batched._Driver, name, "stage " + name.lstrip("_"))
    for name, text in PARTS.items():
        label(mtcnn_batched, name, "part " + text)


# calls that only make a view or wrap a tensor: they keep the GIL (cutting four of them per box out of the CPU
# driver's crops changed nothing beside a busy thread)
VIEWS = {"aten::" + name for name in ("select", "slice", "unsqueeze", "squeeze", "narrow", "view", "as_strided",
                                       "permute", "expand", "t", "transpose", "detach", "alias", "lift_fresh",
                                       "resolve_conj", "resolve_neg", "unbind", "split", "chunk", "flip")}


def calls_by_stage(detect, views: bool = True) -> dict[str, int]:
    """Top-level aten calls of one `detect()`, by the stage label above them ("other" outside every stage) and,
    within a stage, the part ("stage2/networks"); `views` False: only the calls that compute."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        detect()
    counts: collections.Counter = collections.Counter()
    for event in prof.events():
        parent = event.cpu_parent
        if not event.name.startswith("aten::") or (parent is not None and parent.name.startswith("aten::")):
            continue
        if not views and event.name in VIEWS:
            continue
        stage, part = "other", ""
        while parent is not None:
            if parent.name.startswith("part ") and not part:
                part = "/" + parent.name.removeprefix("part ")
            if parent.name.startswith("stage "):
                stage = parent.name.removeprefix("stage ")
                break
            parent = parent.cpu_parent
        counts[stage + part] += 1
    return dict(sorted(counts.items()))


def wall_ms(detect, repeats: int, beside: int) -> float:
    detect()
    with gil_holders(beside):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            detect()
            times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beside", default="0,1", help="GIL-holding threads beside the detection (comma list)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    labelled_stages()
    pnet, rnet, onet = load_networks(torch.device("cpu"))
    photos = {"astronaut 512x512": samples.astronaut(), "mosaic of 4 1104x1104": samples.mosaic(4, 0)}
    rows = []
    with torch.inference_mode():
        for name, img in photos.items():
            drivers = {
                "batched (PyTorch twins)": lambda img=img: mtcnn_batched.detect_mtcnn_batched(
                    [img], pnet, rnet, onet, nms="torch", area="torch"),
                "cpu": lambda img=img: mtcnn_cpu.detect_mtcnn_cpu(img, pnet, rnet, onet),
            }
            for driver, detect in drivers.items():
                stages, computing = calls_by_stage(detect), calls_by_stage(detect, views=False)
                row = {"image": name, "driver": driver, "aten_calls": sum(stages.values()),
                       "aten_calls_by_stage": stages,
                       "aten_calls_after_pnet": sum(v for k, v in stages.items()
                                                    if k.split("/")[0] not in ("stage1", "other")),
                       "computing_calls": sum(computing.values()), "computing_calls_by_stage": computing,
                       "computing_calls_after_pnet": sum(v for k, v in computing.items()
                                                         if k.split("/")[0] not in ("stage1", "other")),
                       **{f"ms_beside_{b}": round(wall_ms(detect, args.repeats, int(b)), 1)
                          for b in args.beside.split(",")}}
                rows.append(row)
                print(row, flush=True)
    path = write_result(args.out, "detector_ops", {
        "benchmark": "detector_ops", "command": "python benchmarks/detector_ops.py " + " ".join(sys.argv[1:]),
        "rows": rows, "torch_threads": 1, "switch_interval_s": SWITCH_INTERVAL_S, "repeats": args.repeats,
        "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
        "load_average_end": os.getloadavg()})
    print(path)


if __name__ == "__main__":
    main()
