"""Doors A/B/A: the same `gpen-tune enhance` runs of `doors.py` on several checkouts, interleaved in rounds on one
set of inputs, so a code change is measured against its baseline in one run (A/B/A/B ...).

    python benchmarks/doors_ab.py --code ../before --code . --only folder --rounds 2
    python benchmarks/doors_ab.py --code ../before --code . --only one_photo_cold,one_photo_warm_cache --fresh-caches

Each round runs every checkout once in the order given; round 1 of the first checkout also fills the kernel caches
(one cache folder for all), so compare rounds 2 and later; with `--fresh-caches` each checkout's runs start from empty
caches (its one_photo_cold is a first-ever run in every round). One JSON `<date>_doors_ab_<gpu or cpu>.json` with each
run's figures (folder faces/s, generator busy, detect time per image summed over threads, video fps, wall), rewritten
after each run (`complete` false until the last), so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doors import ROOT, SOLVAY, busy_share, environment, make_inputs, sizes, user_runs  # noqa: E402
from results_file import result_path, write_at  # noqa: E402


def figures(name: str, run: dict) -> dict:
    """The per-run numbers worth comparing: whole-process wall and rate, busy share, step seconds per image."""
    out = {"rc": run["rc"], "wall_s": run["wall_s"], "graph_fallback": run.get("graph_fallback")}
    summary = run.get("summary") or {}
    images = run.get("images") or []
    if summary.get("faces"):
        out["faces_per_s"] = round(summary["faces"] / run["wall_s"], 1)
        out["faces"], out["images"] = summary["faces"], summary["images"]
        out["pipeline_wall_s"] = summary.get("wall_s")
    out["generator_busy"] = busy_share(run)
    if summary.get("detector_calls"):
        out["detector_calls"] = summary["detector_calls"]
    steps: dict[str, list[float]] = {}
    for job in images:
        for step, sec in (job.get("timings_s") or {}).items():
            steps.setdefault(step, []).append(sec)
    out["step_ms_per_image"] = {k: round(1000 * float(np.mean(v)), 2) for k, v in steps.items()}
    frames = ((images[0] if images else {}).get("video") or {}).get("frames")
    if frames and run["rc"] == 0:
        out["fps"] = round(frames / run["wall_s"], 2)
    if run["rc"] != 0:
        out["output_tail"] = run.get("output_tail")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", type=Path, action="append", required=True,
                    help="a checkout whose gpen_tune the CLI runs (give two or more; the first is the baseline)")
    ap.add_argument("--only", default="folder", help="comma list of doors.py's CLI runs (default: folder)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="CPU form: GPEN-BFR-256, small folder/clips/photo")
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--image", type=Path, default=SOLVAY)
    ap.add_argument("--extra", default="", help="extra enhance options for every CLI run (quoted)")
    ap.add_argument("--code-extra", action="append", default=None,
                    help="extra enhance options of each --code in turn (quoted, '' for none): one checkout twice "
                         "with two settings is an A/B of a flag")
    ap.add_argument("--video-size", default=None, metavar="WxH", help="the test clips' size (default: 1920x1080; "
                    "the CPU form 640x360)")
    ap.add_argument("--video-frames", type=int, default=None, help="frames of each test clip (default: doors.py's)")
    ap.add_argument("--folder-images", type=int, default=None, help="photos in the folder (default: doors.py's)")
    ap.add_argument("--fresh-caches", action="store_true", help="empty the kernel caches before every checkout's "
                    "runs: each one_photo_cold is a first-ever run (compare every round)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    from timing import bench_device

    device = bench_device(args.device)
    sz = sizes(args.small)
    sz["video_frames"] = args.video_frames or sz["video_frames"]
    sz["folder_images"] = args.folder_images or sz["folder_images"]
    sz["video_size"] = tuple(map(int, args.video_size.split("x"))) if args.video_size else sz["video_size"]
    code_extra = args.code_extra or [""] * len(args.code)
    if len(code_extra) != len(args.code):
        ap.error("give one --code-extra per --code")
    work = Path(tempfile.mkdtemp(prefix="gpen-doors-ab-"))
    inputs = make_inputs(work, sz, args.image)
    only = set(args.only.split(","))
    codes = [c.resolve() for c in args.code]
    rounds: list[dict] = []
    result = {"benchmark": "doors_ab", "command": shlex.join([Path(sys.executable).name, *sys.argv]),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment": environment(),
              "device": device.type, "sizes": sz, "codes": [str(c) for c in codes], "code_extra": code_extra,
              "only": sorted(only),
              "folder": inputs["folder_info"], "complete": False, "runs": rounds}
    name = ((result["environment"].get("gpu") if device.type == "cuda" else None) or "cpu").replace(" ", "-")
    tag = f"_{args.tag}" if args.tag else ""
    path = result_path(args.out, f"doors_ab_{name}{tag}")
    for r in range(args.rounds):
        for code, extra in zip(codes, code_extra, strict=True):
            if args.fresh_caches:
                shutil.rmtree(work / "kernel-caches", ignore_errors=True)
            runs = user_runs(inputs, sz, device.type, shlex.split(args.extra) + shlex.split(extra), code, only)
            row = {"round": r + 1, "code": str(code), "extra": extra, "imports_s": runs["imports"]["wall_s"]}
            row |= {name: figures(name, run) for name, run in runs.items() if name != "imports"}
            rounds.append(row)
            print(json.dumps(row), flush=True)
            write_at(path, result)              # each finished run kept, should the rest be cut short
    shutil.rmtree(work, ignore_errors=True)
    result["complete"] = True
    print(f"wrote {write_at(path, result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
