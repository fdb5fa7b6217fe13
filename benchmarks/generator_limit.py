"""How close does GPEN's generator get to the H200's limit? One unattended run: correctness on the device, then
ms / faces/s / TFLOP/s / % of peak / peak memory / PSNR for every fast-path variant and batch size.

    python benchmarks/generator_limit.py                      # full run, ~6-7 min on an H200
    python benchmarks/generator_limit.py --quick              # ~2 min
    python benchmarks/generator_limit.py --profile fused_bf16_triton   # + torch.profiler tables (bs1, best batch)
    python benchmarks/generator_limit.py --device cpu --model tiny     # CPU smoke test of the script itself

Reference = our model in fp32 eager computed the upstream way (per-sample grouped convs, TF32 off), on the same
weights (synthetic unless --weights) and inputs (real face crops). Every row: CUDA-event median of N calls after
warm-up, peak allocated/reserved memory from reset_peak_memory_stats (warm-up excluded, so cuDNN's algorithm
search is not in it; weights included), PSNR / max-abs vs the reference for exactly the faces in that batch.
Writes JSON (rewritten after every row, so a killed run keeps what it measured) and prints a table last.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from generator_variants import VARIANTS, SkipRow, build_variant, plan  # noqa: E402
from timing import Stopwatch, queued_calls, sync  # noqa: E402

from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.model import MODELS, GPENConfig  # noqa: E402
from gpen_tune.model.reference import reference_forward  # noqa: E402

PEAK_TFLOPS_BF16 = 790.0  # dense bf16 GEMM rate measured on an H200 (the roofline the report compares to)
MIB = 2**20

# ---------------------------------------------------------------------------------------------------------------
# inputs


def face_inputs(size: int, n: int, source: str = "auto") -> tuple[torch.Tensor, str]:
    """[n, 3, S, S] in [-1, 1]: the detector's aligned crops of the bundled photos repeated to n ("auto"), or
    rotated and scaled crops around the astronaut's face ("astronaut", or when no face is found)."""
    from gpen_tune.face.samples import aligned_face_crops

    crops = aligned_face_crops(size, n) if source != "astronaut" else None
    if crops is not None and len(crops) > 0:
        t = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        reps = math.ceil(n / t.shape[0])
        return t.repeat(reps, 1, 1, 1)[:n].contiguous(), (
            f"gpen_tune.face.samples.aligned_face_crops({size}, {n}): {len(crops)} crops of real faces "
            "(the detector's finds in the bundled photos, repeated to n)")
    why = "--inputs astronaut" if source == "astronaut" else "aligned_face_crops returned no faces"
    from skimage import data

    img = torch.from_numpy(data.astronaut()).permute(2, 0, 1).float()[None] / 127.5 - 1.0   # [1, 3, 512, 512]
    gen = torch.Generator().manual_seed(0)
    thetas = []
    for i in range(n):
        ang = math.radians(float(torch.empty(1).uniform_(-15, 15, generator=gen)))
        scale = float(torch.empty(1).uniform_(0.9, 1.1, generator=gen))
        flip = -1.0 if i % 2 else 1.0
        half = 0.42 * scale           # crop side ~0.84 of the image: face in the middle, as GPEN's template
        cx, cy = (226 / 256) - 1.0, (140 / 256) - 1.0
        ca, sa = math.cos(ang) * half, math.sin(ang) * half
        thetas.append([[ca * flip, -sa, cx], [sa * flip, ca, cy]])
    theta = torch.tensor(thetas)
    grid = torch.nn.functional.affine_grid(theta, [n, 3, size, size], align_corners=False)
    out = torch.nn.functional.grid_sample(img.expand(n, -1, -1, -1), grid, mode="bilinear",
                                          padding_mode="reflection", align_corners=False)
    return out.clamp(-1, 1).contiguous(), (
        f"skimage astronaut: {n} crops around the face, rotations +-15 deg, scale 0.9-1.1, every 2nd mirrored "
        f"(real face crops unavailable: {why})")


# ---------------------------------------------------------------------------------------------------------------
# measuring


def fidelity(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """PSNR on the [-1, 1] image (clamped like the pipeline's output; peak-to-peak 2), raw PSNR, rel-L2, max-abs."""
    out = out.float()
    ref = ref.float()
    finite = bool(torch.isfinite(out).all())
    o = torch.nan_to_num(out, nan=0.0, posinf=1e4, neginf=-1e4)
    mse_c = float((o.clamp(-1, 1) - ref.clamp(-1, 1)).square().mean())
    mse_r = float((o - ref).square().mean())
    return dict(
        finite=finite,
        psnr_db=round(10 * math.log10(4.0 / mse_c), 2) if mse_c > 0 else float("inf"),
        psnr_raw_db=round(10 * math.log10(4.0 / mse_r), 2) if mse_r > 0 else float("inf"),
        rel_l2=float((o - ref).norm() / ref.norm().clamp_min(1e-12)),
        max_abs=float((o - ref).abs().max()),
    )


def graph_callable(fn, xb: torch.Tensor):
    """Capture fn(static_x) in a CUDA graph; returns (call, static_out). Warm-up on a side stream first."""
    static_x = xb.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(static_x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    torch.cuda.reset_peak_memory_stats()
    with torch.cuda.graph(g):
        static_out = fn(static_x)
    torch.cuda.synchronize()

    def call(x: torch.Tensor) -> torch.Tensor:
        static_x.copy_(x)
        g.replay()
        return static_out

    return call, static_out, g


def run_row(fn, name: str, batch: int, inputs: torch.Tensor, ref: torch.Tensor, cfg: GPENConfig,
            device: torch.device, base_alloc: int, base_res: int, target_s: float) -> dict:
    spec = VARIANTS[name]
    idx = torch.arange(batch) % inputs.shape[0]
    xb = inputs[idx.to(inputs.device)].contiguous()
    row: dict = dict(batch=batch)
    cuda = device.type == "cuda"
    with torch.no_grad():
        with Stopwatch(device) as first:
            if spec.get("compile") and batch > 1:
                torch._dynamo.mark_dynamic(xb, 0)
            out = fn(xb)                                 # first call: compile / cuDNN algorithm search
        row["first_call_s"] = round(first.seconds, 3)
        graph = None
        if spec.get("graph"):
            if not cuda:
                raise SkipRow("CUDA Graph needs CUDA")
            call, out, graph = graph_callable(fn, xb)
            peak_alloc = torch.cuda.max_memory_allocated()
            peak_res = torch.cuda.max_memory_reserved()
            step = lambda: call(xb)  # noqa: E731
        else:
            for _ in range(2):
                fn(xb)
            sync(device)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            holder = {}
            step = lambda: holder.__setitem__("o", fn(xb))  # noqa: E731
        est = queued_calls(step, device, 2)
        n = int(max(5 if cuda else 2, min(60, target_s * 1e3 / max(min(est), 1e-3))))
        times = queued_calls(step, device, n)
        if not spec.get("graph"):
            out = holder["o"]
            if cuda:
                peak_alloc = torch.cuda.max_memory_allocated()
                peak_res = torch.cuda.max_memory_reserved()
        times.sort()
        ms = statistics.median(times)
        flops = cfg.flops_per_face() * batch
        row.update(
            n_timed=n, ms=round(ms, 4), ms_per_face=round(ms / batch, 4), faces_per_s=round(batch * 1e3 / ms, 1),
            ms_min=round(times[0], 4), ms_p90=round(times[max(0, math.ceil(0.9 * len(times)) - 1)], 4),
            tflops=round(flops / (ms * 1e-3) / 1e12, 1),
        )
        row["pct_peak"] = round(100 * row["tflops"] / PEAK_TFLOPS_BF16, 1)
        if cuda:
            row["peak_alloc_mib"] = round((peak_alloc - base_alloc) / MIB, 1)
            row["peak_reserved_mib"] = round((peak_res - base_res) / MIB, 1)
        row.update(fidelity(out, ref[idx.to(ref.device)]))
        del graph
    return row


def profile_variant(name: str, master, cfg, inputs, device, batches: list[int], out_dir: Path, stamp: str) -> dict:
    """torch.profiler key-averages (top 25 kernels by self device time) for each batch; tables also as .txt."""
    from torch.profiler import ProfilerActivity, profile

    fn = build_variant(name, master, device)
    tables = {}
    for b in batches:
        xb = inputs[torch.arange(b) % inputs.shape[0]].contiguous()
        with torch.no_grad():
            for _ in range(3):
                fn(xb)
            torch.cuda.synchronize()
            acts = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=acts) as prof:
                for _ in range(3):
                    fn(xb)
                torch.cuda.synchronize()
        ka = prof.key_averages()
        table = None
        for key in ("self_device_time_total", "self_cuda_time_total", "cuda_time_total"):
            try:
                table = ka.table(sort_by=key, row_limit=25, max_name_column_width=70)
                break
            except Exception:
                continue
        tables[f"bs{b}"] = table or str(ka)
        path = out_dir / f"profile_{stamp}_{name}_bs{b}.txt"
        path.write_text(f"{name} batch {b} (3 calls)\n{tables[f'bs{b}']}\n")
        print(f"\n=== profile {name} bs{b} (3 calls) -> {path}\n{tables[f'bs{b}']}")
    return tables


# ---------------------------------------------------------------------------------------------------------------


def env_info(device: torch.device) -> dict:
    info = dict(
        date_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        torch=torch.__version__, cuda=torch.version.cuda, python=platform.python_version(),
        host=platform.node(), device=str(device), peak_tflops_bf16=PEAK_TFLOPS_BF16,
        tf32="off (fp32 rows are true fp32)",
    )
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cudnn"] = torch.backends.cudnn.version()
        info["cudnn_benchmark"] = torch.backends.cudnn.benchmark
    else:
        info["device_name"] = platform.processor() or "cpu"
    try:
        info["git_commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                                            text=True, timeout=10).stdout.strip() or None
    except Exception:
        info["git_commit"] = None
    return info


def write_json(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str))
    os.replace(tmp, path)


def table(rows: list[dict]) -> str:
    head = (f"{'variant':28} {'model':13} {'bs':>4} {'ms':>9} {'ms/face':>8} {'faces/s':>8} {'TFLOP/s':>8} "
            f"{'%peak':>6} {'alloc':>8} {'resv':>8} {'PSNR':>6} {'maxabs':>8}  note")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "ms" not in r:
            lines.append(f"{r['variant']:28} {r['model']:13} {r['batch']:>4}  {r.get('status', '')}: "
                         f"{r.get('error', r.get('reason', ''))[:90]}")
            continue
        note = "" if r.get("finite", True) else "NON-FINITE"
        lines.append(
            f"{r['variant']:28} {r['model']:13} {r['batch']:>4} {r['ms']:>9.3f} {r['ms_per_face']:>8.3f} "
            f"{r['faces_per_s']:>8.1f} {r['tflops']:>8.1f} {r['pct_peak']:>6.1f} "
            f"{r.get('peak_alloc_mib', float('nan')):>8.0f} {r.get('peak_reserved_mib', float('nan')):>8.0f} "
            f"{r['psnr_db']:>6.1f} {r['max_abs']:>8.4f}  {note}")
    return "\n".join(lines)


def targets(rows: list[dict], main_label: str) -> list[str]:
    """The generator targets, read off this run's rows (GPEN-BFR-512, half precision, PSNR >= 40)."""
    ok = [r for r in rows if r["model"] == main_label and "ms" in r and r.get("finite")]
    half = [r for r in ok if VARIANTS[r["variant"]]["dtype"] in ("bf16", "fp16") and r["psnr_db"] >= 40]
    out = []
    if half:
        best = max(half, key=lambda r: r["faces_per_s"])
        out.append(f"best faces/s (half, PSNR>=40): {best['faces_per_s']:.0f} ({best['variant']} bs{best['batch']}, "
                   f"{best['tflops']} TFLOP/s, PSNR {best['psnr_db']}) target >= 1000")
        bs1 = [r for r in half if r["batch"] == 1]
        if bs1:
            b1 = min(bs1, key=lambda r: r["ms"])
            out.append(f"best bs1: {b1['ms']:.3f} ms ({b1['variant']}) target <= 2.0")
        for b, lim in ((1, 400), (4, 1000)):
            rb = [r for r in half if r["batch"] == b and VARIANTS[r["variant"]]["dtype"] == "bf16"
                  and "peak_alloc_mib" in r]
            if rb:
                m = min(rb, key=lambda r: r["peak_alloc_mib"])
                out.append(f"bs{b} bf16 peak allocated: {m['peak_alloc_mib']:.0f} MiB ({m['variant']}) "
                           f"target <= {lim}")
    worst = min((r["psnr_db"] for r in half), default=None)
    if worst is not None:
        out.append(f"lowest PSNR among passing half rows: {worst} dB; non-finite rows: "
                   f"{sum(1 for r in rows if 'ms' in r and not r.get('finite'))}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="folder for the JSON")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", choices=("full", "tiny"), default="full",
                    help="full: GPEN-BFR-512 (+256, 1024 rows); tiny: GPENConfig(32/16, narrow 0.25/0.125) smoke test")
    ap.add_argument("--weights", default=None, help="GPEN-BFR-512 checkpoint (default: synthetic weights)")
    ap.add_argument("--quick", action="store_true", help="~2 minute subset")
    ap.add_argument("--variants", default=None, help="comma list: only these variants")
    ap.add_argument("--batches", default=None, help="comma list: only these batch sizes (e.g. 1,64)")
    ap.add_argument("--cudnn-benchmark-limit", type=int, default=None,
                    help="algorithms cuDNN tries per conv shape (torch default 10; 0 = all)")
    ap.add_argument("--profile", default=None, metavar="VARIANT", help="also write torch.profiler tables")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting rows after this many seconds (380; 100 with --quick)")
    ap.add_argument("--target-s", type=float, default=None, help="timed seconds per row (0.4 / 0.25 quick)")
    ap.add_argument("--inputs", choices=("auto", "astronaut"), default="auto",
                    help="auto: gpen_tune.face.samples.aligned_face_crops when importable, else astronaut crops")
    ap.add_argument("--n-ref", type=int, default=16, help="distinct faces (reference outputs) per model")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    args = ap.parse_args(argv)

    run = Stopwatch().start()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"--device {args.device}: CUDA is not available here; use --device cpu --model tiny", file=sys.stderr)
        return 2
    tiny = args.model == "tiny"
    budget = args.budget_s or (100.0 if args.quick else 380.0)
    target_s = args.target_s or (0.25 if args.quick else 0.4)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    torch.manual_seed(0)

    if tiny:
        models = {"main": ("tiny-32", GPENConfig(32, narrow=0.25)), "small": ("tiny-16", GPENConfig(16, narrow=0.125))}
    else:
        models = {"main": ("GPEN-BFR-512", MODELS["GPEN-BFR-512"].config),
                  "small": ("GPEN-BFR-256", MODELS["GPEN-BFR-256"].config),
                  "large": ("GPEN-BFR-1024", MODELS["GPEN-BFR-1024"].config)}
    todo = plan(args.quick, tiny)
    if args.variants:
        keep = set(args.variants.split(","))
        unknown = keep - set(VARIANTS)
        if unknown:
            print(f"--variants: unknown {sorted(unknown)}; known: {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        todo = [t for t in todo if t[1] in keep or t[1] == "reference_fp32"]
    if args.batches:
        want = {int(b) for b in args.batches.split(",")}
        todo = [(k, v, tuple(b for b in bs if b in want)) for k, v, bs in todo]
        todo = [t for t in todo if t[2]]
    if args.cudnn_benchmark_limit is not None:
        torch.backends.cudnn.benchmark_limit = args.cudnn_benchmark_limit
    if args.profile and args.profile not in VARIANTS:
        print(f"--profile: unknown variant {args.profile!r}; known: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2

    args.out.mkdir(parents=True, exist_ok=True)
    info = env_info(device)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    slug = "".join(ch if ch.isalnum() else "-" for ch in info["device_name"].lower()).strip("-")[:24] or "dev"
    path = args.out / f"generator_limit_{stamp}_{slug}{'_quick' if args.quick else ''}{'_tiny' if tiny else ''}.json"
    payload: dict = dict(env=info, budget_s=budget, inputs={}, weights=args.weights or "synthetic", rows=[],
                         flops_per_face={lab: cfg.flops_per_face() for lab, cfg in models.values()})
    print(f"writing {path}", flush=True)

    state: dict = {}   # per model key: master, cfg, inputs, ref
    dead = None        # a sticky CUDA error (illegal address, ...) ends the run: later rows would all fail
    for key, name, batches in todo:
        label, cfg = models[key]
        if dead:
            payload["rows"] += [dict(variant=name, model=label, batch=b, status="skipped", reason=dead)
                                for b in batches]
            continue
        if key not in state:
            if run.elapsed() > budget:
                for b in batches:
                    payload["rows"].append(dict(variant=name, model=label, batch=b, status="skipped",
                                                reason="time budget"))
                continue
            weights = args.weights if (args.weights and key == "main") else "synthetic"
            master = load_model(weights, model=cfg, device="cpu")
            n_ref = args.n_ref if cfg.size <= 512 else max(2, args.n_ref // 4)
            inputs, source = face_inputs(cfg.size, n_ref, args.inputs)
            payload["inputs"][label] = source
            inputs = inputs.to(device)
            with Stopwatch(device) as ref_time:
                ref_m = copy.deepcopy(master).to(device)
                with torch.no_grad():
                    chunk = 4 if cfg.size <= 512 else 1
                    ref = torch.cat([reference_forward(ref_m, inputs[i:i + chunk]) for i in range(0, n_ref, chunk)])
                del ref_m
            print(f"[{label}] reference outputs for {n_ref} faces in {ref_time.seconds:.1f}s "
                  f"(finite={bool(torch.isfinite(ref).all())}, std={float(ref.std()):.3f}); inputs: {source}",
                  flush=True)
            state[key] = dict(master=master, cfg=cfg, inputs=inputs, ref=ref)
        st = state[key]
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            base_alloc, base_res = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        else:
            base_alloc = base_res = 0
        fn = None
        build_err = None
        build_tb = ""
        cudnn_bench = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = VARIANTS[name].get("cudnn_benchmark", cudnn_bench)
        try:
            if run.elapsed() > budget - VARIANTS[name].get("min_left_s", 0):
                raise SkipRow("time budget")
            fn = build_variant(name, st["master"], device)
            weights_mib = (torch.cuda.memory_allocated() - base_alloc) / MIB if device.type == "cuda" else None
        except SkipRow as e:
            build_err = ("skipped", str(e))
        except Exception as e:
            build_err = ("error", f"build: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
            build_tb = traceback.format_exc()[-3000:]
            traceback.print_exc()
        for b in batches:
            row = dict(variant=name, model=label, dtype=VARIANTS[name]["dtype"])
            if build_err:
                row.update(batch=b, status=build_err[0], **{"reason" if build_err[0] == "skipped" else "error":
                                                            build_err[1]})
                if build_err[0] == "error":
                    row["traceback"] = build_tb
            elif run.elapsed() > budget:
                row.update(batch=b, status="skipped", reason="time budget")
            else:
                try:
                    row.update(run_row(fn, name, b, st["inputs"], st["ref"], st["cfg"], device,
                                       base_alloc, base_res, target_s))
                    row["status"] = "ok"
                    if weights_mib is not None:
                        row["weights_mib"] = round(weights_mib, 1)
                except SkipRow as e:
                    row.update(batch=b, status="skipped", reason=str(e))
                except Exception as e:
                    msg = str(e).splitlines()[0][:300] if str(e) else ""
                    row.update(batch=b, status="error", error=f"{type(e).__name__}: {msg}",
                               traceback=traceback.format_exc()[-3000:])
                    traceback.print_exc()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
            payload["rows"].append(row)
            err = row.get("error", "")
            if "CUDA error" in err or "illegal memory" in err or "device-side assert" in err:
                dead = f"CUDA context lost after {name} bs{b}: {err[:120]}"
            payload["elapsed_s"] = round(run.elapsed(), 1)
            write_json(path, payload)
            if "ms" in row:
                print(f"  {name:28} {label:13} bs{b:<4} {row['ms']:9.3f} ms  {row['faces_per_s']:8.1f} faces/s  "
                      f"{row['tflops']:6.1f} TFLOP/s  alloc {row.get('peak_alloc_mib', '-')} MiB  "
                      f"PSNR {row['psnr_db']} dB  first {row['first_call_s']}s", flush=True)
            else:
                print(f"  {name:28} {label:13} bs{b:<4} {row['status']}: {row.get('error', row.get('reason'))}",
                      flush=True)
        del fn
        torch.backends.cudnn.benchmark = cudnn_bench
        if name.endswith("compile") or VARIANTS[name].get("compile"):
            torch._dynamo.reset()

    if args.profile and device.type == "cuda" and not dead:
        st = state.get("main")
        if st is None:
            print("--profile: main model was not built", file=sys.stderr)
        else:
            mine = [r for r in payload["rows"] if r["variant"] == args.profile and r["model"] == models["main"][0]
                    and "ms" in r]
            best = max(mine, key=lambda r: r["faces_per_s"])["batch"] if mine else 64
            try:
                payload["profile"] = dict(variant=args.profile, tables=profile_variant(
                    args.profile, st["master"], st["cfg"], st["inputs"], device, sorted({1, best}), args.out, stamp))
            except Exception as e:
                payload["profile"] = dict(variant=args.profile, error=f"{type(e).__name__}: {e}")
                traceback.print_exc()
    payload["targets"] = targets(payload["rows"], models["main"][0])
    payload["elapsed_s"] = round(run.elapsed(), 1)
    write_json(path, payload)
    print()
    print(f"{info['device_name']} | torch {info['torch']} cuda {info['cuda']} triton {info.get('triton')} | "
          f"inputs: {payload['inputs'].get(models['main'][0], '?')[:80]}")
    print(table(payload["rows"]))
    print("\nTARGETS (GPEN-BFR-512):" if not tiny else "\nTARGETS (tiny model; not the real targets):")
    for line in payload["targets"]:
        print("  " + line)
    print(f"elapsed {payload['elapsed_s']} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
