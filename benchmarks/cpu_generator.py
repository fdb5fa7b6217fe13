"""The generator on the CPU: gpen-tune's CPU path against upstream GPEN's formulation, same weights, one run.

Variants (all at batch 1, the CPU's batch: a bigger batch gains nothing there):
  upstream      `gpen_tune.model.reference`: per-sample modulated weights, grouped convs, fp32 (upstream's forward)
  fp32          our FullGenerator in fp32 (no switches)
  bf16          --amp bf16 on the FullGenerator
  fused-fp32    --fused (the fused generator's PyTorch passes in fp32)
  fused-bf16    --fused --amp bf16 (the fused generator's PyTorch passes, channels-last)
  onednn-bf16   --fused --onednn --amp bf16 (the fused generator's oneDNN form, gpen_tune.model.fused_onednn)
  onednn-fp32   --fused --onednn (the same in fp32)
  preset-cpu    what `--preset auto` builds on this CPU (`build_restorer` with `choose_cpu_preset`'s config: on an
                AVX512-BF16 / AMX-BF16 CPU the same module as onednn-bf16)
  ort-fp32      --backend onnxruntime: the exported graph on ONNX Runtime's CPU provider, all graph optimizations
  ort-fp32-basic  the same with ONNX Runtime's basic graph optimizations only (constant folding, no fusions)
  ort-fp32-1t   the same as ort-fp32 with one intra-op thread (the other core left to the rest of the pipeline)
  ort-fp16      --backend onnxruntime --amp fp16 (ONNX Runtime's CPU provider casts around fp16 operators it lacks)
Calls are interleaved (A B C ... A B C ...) so a load change on a shared machine hits every variant alike; the
JSON has medians of wall time and of process CPU time / threads (less sensitive to other processes), the
relative IQR of each, the load average before and after, PSNR vs fp32 and the command.

    python benchmarks/cpu_generator.py --model GPEN-BFR-256 --repeats 9 --out benchmarks/results
    python benchmarks/cpu_generator.py --variants upstream,fused-bf16,preset-cpu,ort-fp32,ort-fp32-basic,ort-fp32-1t
    python benchmarks/cpu_generator.py --variants upstream,fused-bf16,onednn-bf16,preset-cpu --repeats 15
    python benchmarks/cpu_generator.py --variants upstream,fused-bf16,preset-cpu --profile fused-bf16,preset-cpu
    python benchmarks/cpu_generator.py --variants upstream,preset-cpu --block 5 --repeats 9 --isolate 4
`--profile`: after the timed calls, torch.profiler over 5 more calls of each named variant; the JSON gets its self
CPU time per call by kind of operator (where the time goes) and its 12 largest operators.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import onnxruntime
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_result  # noqa: E402
from timing import Stopwatch, summary  # noqa: E402

from gpen_tune.export.onnx import onnx_graph, ort_session  # noqa: E402
from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model.fused import fuse  # noqa: E402
from gpen_tune.model.fused_onednn import fuse_onednn  # noqa: E402
from gpen_tune.model.io import psnr  # noqa: E402
from gpen_tune.model.reference import ReferenceGenerator  # noqa: E402
from gpen_tune.restore import build_restorer  # noqa: E402
from gpen_tune.restore.onnx_backend import OnnxRuntimeForward  # noqa: E402
from gpen_tune.tune.amp import cast_model  # noqa: E402
from gpen_tune.tune.hardware import cpu_capabilities  # noqa: E402
from gpen_tune.tune.options import choose_cpu_preset  # noqa: E402


def build_variants(weights: str, model: str, names: list[str]) -> tuple[dict, torch.nn.Module, dict]:
    base = load_model(weights, model)
    variants, notes = {}, {}
    if "upstream" in names:
        variants["upstream"] = ReferenceGenerator(base)
    if "fp32" in names:
        variants["fp32"] = base
    if "bf16" in names:
        variants["bf16"] = cast_model(copy.deepcopy(base), torch.bfloat16)
    if "fused-fp32" in names:
        variants["fused-fp32"] = fuse(base, torch.float32, impl="torch")
    if "fused-bf16" in names:
        variants["fused-bf16"] = fuse(base, torch.bfloat16, impl="torch")
    if "onednn-bf16" in names:
        variants["onednn-bf16"] = fuse_onednn(base, torch.bfloat16)
    if "onednn-fp32" in names:
        variants["onednn-fp32"] = fuse_onednn(base, torch.float32)
    if "preset-cpu" in names:    # before ONNX Runtime's variants: the variant after one starts with caches it filled
        _, cfg, why = choose_cpu_preset(cpu_capabilities())
        restorer = build_restorer(copy.deepcopy(base), cfg, device="cpu", max_batch=1)
        variants["preset-cpu"] = restorer.forward
        notes["preset-cpu"] = {"config": cfg.describe(), "reason": why, "skipped": restorer.skipped}
    ort_variants = {"ort-fp32": ("fp32", "all", None), "ort-fp32-basic": ("fp32", "basic", None),
                    "ort-fp32-1t": ("fp32", "all", 1), "ort-fp16": ("fp16", "all", None)}
    graphs: dict[str, bytes] = {}
    for name, (dtype, level, threads) in ort_variants.items():
        if name in names:
            if dtype not in graphs:
                graphs[dtype] = onnx_graph(base, dtype).SerializeToString()
            variants[name] = OnnxRuntimeForward(ort_session(graphs[dtype], threads=threads, optimization=level))
            notes[name] = {"config": f"onnxruntime {onnxruntime.__version__}, {dtype}, graph optimizations {level}, "
                                     f"intra-op threads {threads or torch.get_num_threads()}"}
    return variants, base, notes


def measure(variants: dict, x: torch.Tensor, repeats: int, threads: int, block: int = 1) -> dict:
    """Rounds of every variant in turn, `block` calls of one variant back to back (as a photo's faces run): with
    block 1 each call follows another variant's, whose memory traffic leaves the caches cold (2-3 ms at
    GPEN-BFR-256 depending on which variant came before)."""
    wall = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    with torch.inference_mode():
        for fn in variants.values():
            fn(x)                                                   # warm-up: oneDNN primitive creation
        for _ in range(repeats):
            for name, fn in variants.items():
                for _ in range(block):
                    with Stopwatch() as sw:
                        fn(x)
                    wall[name].append(sw.ms)
                    cpu[name].append(sw.process_cpu_s * 1000 / threads)
    return {k: {"wall": summary(wall[k]), "cpu_per_thread": summary(cpu[k]), "wall_ms": wall[k]}
            for k in variants}


# where a variant's time goes: operator name -> kind (the rest is "other": views, small vector math, Python)
KINDS = {"mkldnn::_convolution_pointwise": "oneDNN conv", "aten::mkldnn_convolution": "oneDNN conv",
         "aten::_convolution": "oneDNN conv", "aten::cat": "concatenate / copy", "aten::copy_": "concatenate / copy",
         "aten::mm": "GEMM (style path, ToRGB)", "aten::addmm": "GEMM (style path, ToRGB)",
         "aten::bmm": "GEMM (style path, ToRGB)", "aten::mul": "elementwise", "aten::mul_": "elementwise",
         "aten::add": "elementwise", "aten::add_": "elementwise", "aten::addcmul": "elementwise",
         "aten::leaky_relu": "elementwise", "aten::leaky_relu_": "elementwise", "aten::fill_": "elementwise",
         "aten::constant_pad_nd": "elementwise"}


def profile(fn, x: torch.Tensor, calls: int = 5) -> dict:
    """Self CPU ms per call by operator kind and the largest operators (torch.profiler; wall of the calling thread,
    the operators' own threads included in theirs)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch.inference_mode(), torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            fn(x)
    ops = {e.key: e.self_cpu_time_total / 1000 / calls for e in prof.key_averages()}
    kinds: dict[str, float] = {}
    for name, ms in ops.items():
        kinds[KINDS.get(name, "other")] = kinds.get(KINDS.get(name, "other"), 0.0) + ms
    top = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:12])
    return {"ms_per_call_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "ms_per_call_total": sum(ops.values()), "largest_ops_ms_per_call": top, "calls": calls}


def _uptime() -> str:
    """`uptime`'s line (the load of the shared machine while the run ended)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="GPEN-BFR-256")
    ap.add_argument("--weights", default="synthetic")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--variants", default="upstream,fp32,bf16,fused-bf16,preset-cpu,ort-fp32")
    ap.add_argument("--block", type=int, default=1, help="calls of one variant back to back in each round")
    ap.add_argument("--profile", default="", help="variants to profile after the timing (comma-separated)")
    ap.add_argument("--isolate", type=int, default=0, metavar="ROUNDS",
                    help="each variant alone in a fresh process (as a user runs it), ROUNDS rounds, order reversed "
                         "every other round; one JSON with every process's rows")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if args.isolate:
        return isolated(args)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_before = os.getloadavg()
    variants, base, notes = build_variants(args.weights, args.model, args.variants.split(","))
    x = torch.rand(1, 3, base.size, base.size) * 2 - 1
    with torch.inference_mode():
        ref = base(x)
        quality = {k: psnr(fn(x), ref) for k, fn in variants.items()}
    timings = measure(variants, x, args.repeats, args.threads, args.block)
    profiles = {name: profile(variants[name], x) for name in filter(None, args.profile.split(","))}
    upstream = timings.get("upstream")
    rows = {}
    for name, t in timings.items():
        row = {"ms_per_face_wall": t["wall"]["median_ms"], "ms_per_face_cpu": t["cpu_per_thread"]["median_ms"],
               "rel_iqr_wall": t["wall"]["rel_iqr"], "psnr_vs_fp32_db": quality[name], "wall_ms": t["wall_ms"],
               **notes.get(name, {})}
        if name in profiles:
            row["profile"] = profiles[name]
        if upstream:
            row["speedup_vs_upstream_wall"] = upstream["wall"]["median_ms"] / t["wall"]["median_ms"]
            row["speedup_vs_upstream_cpu"] = upstream["cpu_per_thread"]["median_ms"] / t["cpu_per_thread"]["median_ms"]
        rows[name] = row
        print(f"{name:12s} wall {row['ms_per_face_wall']:8.1f} ms  cpu/thread {row['ms_per_face_cpu']:8.1f} ms  "
              f"iqr {row['rel_iqr_wall']:.2f}  psnr {quality[name]:.1f} dB", flush=True)
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "model": args.model, "weights": args.weights, "batch": 1, "threads": args.threads,
        "repeats": args.repeats, "block": args.block, "interleaved": True,
        "cpu": platform.processor() or platform.machine(),
        "capabilities": cpu_capabilities().__dict__, "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "uptime": _uptime(),
        "noise": "rel_iqr_wall per row; ms_per_face_cpu = process CPU time / threads (other processes inflate "
                 "wall time, much less CPU time)",
        "rows": rows,
    }
    print(write_result(args.out, f"cpu_generator_{args.model}", result))


def isolated(args: argparse.Namespace) -> None:
    """`--isolate`: no variant shares a process (so none starts from caches or a heap another one left), the
    processes alternate; the speed-ups are per round (each variant against upstream's process of that round)."""
    names = args.variants.split(",")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.isolate):
            row = {}
            for name in names if r % 2 == 0 else names[::-1]:
                cmd = [sys.executable, __file__, "--model", args.model, "--weights", args.weights, "--repeats",
                       str(args.repeats), "--threads", str(args.threads), "--block", str(args.block), "--variants",
                       name, "--out", str(Path(tmp) / f"{r}-{name}")]
                subprocess.run(cmd, check=True, capture_output=True, text=True)
                (made,) = (Path(tmp) / f"{r}-{name}").glob("*.json")
                row[name] = json.loads(made.read_text())["rows"][name]
            if "upstream" in row:
                for one in row.values():
                    one["speedup_vs_upstream_wall"] = row["upstream"]["ms_per_face_wall"] / one["ms_per_face_wall"]
            print(f"round {r + 1}: " + "  ".join(
                f"{n} {one['ms_per_face_wall']:.1f} ms" + (f" ({one['speedup_vs_upstream_wall']:.2f}x)"
                                                          if "speedup_vs_upstream_wall" in one else "")
                for n, one in row.items()), flush=True)
            rounds.append(row)
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "model": args.model, "weights": args.weights, "batch": 1, "threads": args.threads, "repeats": args.repeats,
        "block": args.block, "isolated": "each variant alone in a fresh process per round, order reversed every "
                                         "other round",
        "cpu": platform.processor() or platform.machine(), "capabilities": cpu_capabilities().__dict__,
        "torch": torch.__version__, "uptime": _uptime(), "rounds": rounds,
        "speedup_vs_upstream_wall": {n: [row[n].get("speedup_vs_upstream_wall") for row in rounds] for n in names},
    }
    print(write_result(args.out, f"cpu_generator_{args.model}_isolated", result))


if __name__ == "__main__":
    main()
