"""Peak resident memory of a whole CPU run: `gpen-tune enhance PHOTO --device cpu --preset auto` under
`/usr/bin/time -v`, repeated (the peak varies by tens of MB between runs: threads, allocator arenas), with the
weights in the official layout (a file with synthetic values unless --weights names a real one).

Targets (issue: CPU-only and 4 GB-GPU users): the 29-face Solvay photo at <= 1.0 GB with GPEN-BFR-256 and
<= 1.5 GB with GPEN-BFR-512. The JSON has every run's peak (kB as `time` reports it, and GB = 10^9 bytes), the
median and the largest, wall time, the command and the load average (wall times of a loaded machine say little;
the peaks hardly depend on load).

    python benchmarks/cpu_memory.py --image solvay_conference_1927.png --model GPEN-BFR-256 --runs 3

`--heap default,kept` interleaves runs with glibc's allocator as it is and with freed memory kept mapped
(`GLIBC_TUNABLES` raising the mmap and trim thresholds for the child, so the generator's activations are not
returned to the OS and faulted in again on every call); each run's restore seconds come from its `--report`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from results_file import write_result  # noqa: E402

TARGET_GB = {"GPEN-BFR-256": 1.0, "GPEN-BFR-512": 1.5}


def weights_file(model: str, folder: Path) -> Path:
    """A checkpoint in the official key layout with synthetic values (what the tests load)."""
    from conftest_weights import checkpoint_file

    path = folder / f"{model}.pth"
    path.write_bytes(checkpoint_file(model).read_bytes())
    return path


HEAPS = {
    "default": None,
    # the largest mmap threshold glibc allows on 64-bit (32 MiB) and a trim threshold no run reaches
    "kept": "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184",
}


def one_run(image: Path, model: str, weights: Path, out: Path, backend: str = "torch", heap: str = "default") -> dict:
    report = out.parent / "report.json"
    cli = [sys.executable, "-m", "gpen_tune", "enhance", str(image), "-o", str(out), "--model", model,
           "--weights", str(weights), "--device", "cpu", "--preset", "auto", "--backend", backend, "--overwrite",
           "--report", str(report)]
    env = dict(os.environ)
    if HEAPS[heap] is not None:
        env["GLIBC_TUNABLES"] = HEAPS[heap]
    proc = subprocess.run(["/usr/bin/time", "-v", *cli], capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"benchmarks/cpu_memory.py: the run failed:\n{proc.stderr[-2000:]}")

    def field(name: str) -> str:
        return re.search(rf"{re.escape(name)}: (.+)", proc.stderr).group(1).strip()

    kb = int(field("Maximum resident set size (kbytes)"))
    data = json.loads(report.read_text())
    timings = data["images"][0].get("timings_s") or {}
    return {"heap": heap, "restore_s": timings.get("restore"), "run_wall_s": data["summary"]["wall_s"],
            "minor_faults": int(field("Minor (reclaiming a frame) page faults")), "max_rss_kb": kb,
            "max_rss_gb": round(kb * 1024 / 1e9, 3), "elapsed": field("Elapsed (wall clock) time (h:mm:ss or m:ss)"),
            "user_s": float(field("User time (seconds)")),
            "faces": int(m.group(1)) if (m := re.search(r"│ faces restored\s+│\s+(\d+)", proc.stdout)) else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--model", default="GPEN-BFR-256", choices=sorted(TARGET_GB))
    ap.add_argument("--weights", type=Path, default=None, help="a real checkpoint (default: synthetic values)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backend", default="torch", choices=("torch", "onnxruntime"),
                    help="the restore backend (--preset auto picks the rest)")
    ap.add_argument("--heap", default="default", help="comma list of allocator settings, run interleaved: "
                    + ", ".join(HEAPS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    heaps = args.heap.split(",")
    if not set(heaps) <= set(HEAPS):
        raise SystemExit(f"--heap: use {', '.join(HEAPS)}")
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights or weights_file(args.model, Path(tmp))
        load_before = os.getloadavg()
        runs = [one_run(args.image, args.model, weights, Path(tmp) / "out", args.backend, heap)
                for _ in range(args.runs) for heap in heaps]
        load_after = os.getloadavg()
    peaks = [r["max_rss_gb"] for r in runs if r["heap"] == heaps[0]]
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "model": args.model, "image": args.image.name, "backend": args.backend,
        "weights": str(args.weights) if args.weights else "official key layout, synthetic values",
        "runs": runs, "median_max_rss_gb": statistics.median(peaks), "largest_max_rss_gb": max(peaks),
        "target_gb": TARGET_GB[args.model],
        "by_heap": {h: {"restore_s": [r["restore_s"] for r in runs if r["heap"] == h],
                        "run_wall_s": [r["run_wall_s"] for r in runs if r["heap"] == h],
                        "max_rss_gb": [r["max_rss_gb"] for r in runs if r["heap"] == h],
                        "minor_faults": [r["minor_faults"] for r in runs if r["heap"] == h]} for h in heaps},
        "load_average_before_after": [load_before, load_after],
        "cores": os.cpu_count(),
    }
    print(json.dumps(result, indent=1))
    suffix = ("" if args.backend == "torch" else f"_{args.backend}") + ("" if heaps == ["default"] else "_heap")
    print(write_result(args.out, f"cpu_memory_{args.model}{suffix}", result))


if __name__ == "__main__":
    main()
