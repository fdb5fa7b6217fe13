"""The toRGB skip's 2x FIR upsample (3 channels): first-call cost in a fresh process and steady time, per formulation.

Why: on an H100 the first generator call of a warm-cache process spent most of its time in this one op
(`F.conv_transpose2d(..., groups=3)` through cuDNN), once per new shape, in every process. Each variant runs in
its own fresh process (CUDA and cuDNN already initialised by an unrelated conv, as in the generator), first on all
of GPEN-512's skip shapes (8 -> 512) at one batch size, then steady (eager, CUDA events):

    convT          F.conv_transpose2d(skip, K, stride 2, padding 1, groups 3) (cuDNN), skip NCHW-contiguous
    convT_nhwc     the same on a channels-last skip (the fused generator's toRGB GEMV writes one)
    convT_native   the same with cuDNN off for the call (PyTorch's own CUDA kernel)
    fir_triton     gpen_tune.ops.fir.upfirdn2d(up=2, pad=(2, 1)) on the Triton FIR kernel (zero insertion first)
    polyphase      one 3x3 grouped conv2d giving the four output phases, then pixel_shuffle(2)
    polyphase_nhwc the same on a channels-last skip

    python benchmarks/skip_upsample.py --batch 32 --dtype bf16      # benchmarks/results/<date>_skip_upsample_bs32.json
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from results_file import write_result  # noqa: E402

VARIANTS = ("convT", "convT_nhwc", "convT_native", "fir_triton", "polyphase", "polyphase_nhwc")


def child(variant: str, batch: int, dtype_name: str) -> dict:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from gpen_tune.ops.fir import make_kernel, upfirdn2d

    dev = torch.device("cuda")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    t0 = time.perf_counter()
    F.conv2d(torch.randn(2, 8, 16, 16, device=dev, dtype=dtype), torch.randn(8, 8, 3, 3, device=dev, dtype=dtype),
             padding=1)                                       # CUDA + cuDNN initialised, as after the encoder
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    k = make_kernel([1, 3, 3, 1]) * 4                         # the 2x upsampler's FIR (gain 4)
    w_t = k.to(dev, dtype).expand(3, 1, 4, 4).contiguous()
    # polyphase weights: output phase (a, b) at (2i+a, 2j+b) reads the padded input's 3x3 window at (i, j)
    w_p = torch.zeros(3, 4, 3, 3)
    for u in range(3):
        for v in range(3):
            x = torch.zeros(1, 1, 3, 3)
            x[0, 0, u, v] = 1
            y = F.conv_transpose2d(x, k.expand(1, 1, 4, 4), stride=2, padding=1)
            for a in range(2):
                for b in range(2):
                    w_p[:, 2 * a + b, u, v] = y[0, 0, 2 + a, 2 + b]
    w_p = w_p.reshape(12, 1, 3, 3).to(dev, dtype)

    def run(x):
        if variant.startswith("convT") and variant != "convT_native":
            return F.conv_transpose2d(x, w_t, stride=2, padding=1, groups=3)
        if variant == "convT_native":
            with torch.backends.cudnn.flags(enabled=False):
                return F.conv_transpose2d(x, w_t, stride=2, padding=1, groups=3)
        if variant == "fir_triton":
            return upfirdn2d(x, k.to(dev), up=2, pad=(2, 1), impl="triton")
        return F.pixel_shuffle(F.conv2d(F.pad(x, (1, 1, 1, 1)), w_p, groups=3), 2)     # polyphase, _nhwc

    fmt = torch.channels_last if variant.endswith("_nhwc") else torch.contiguous_format
    xs = [torch.randn(batch, 3, s, s, device=dev, dtype=dtype).contiguous(memory_format=fmt)
          for s in (4, 8, 16, 32, 64, 128, 256)]
    first = {}
    for x in xs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = run(x)
        torch.cuda.synchronize()
        first[x.shape[-1] * 2] = round(1000 * (time.perf_counter() - t0), 2)
        ref = F.conv_transpose2d(x.float(), w_t.float(), stride=2, padding=1, groups=3)
        err = float((y.float() - ref).abs().max())
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for x in xs:
        run(x)
    start.record()
    for _ in range(20):
        for x in xs:
            run(x)
    end.record()
    torch.cuda.synchronize()
    return {"variant": variant, "cuda_cudnn_init_s": round(init_s, 3), "first_call_ms": first,
            "first_calls_total_ms": round(sum(first.values()), 1),
            "steady_ms_all_shapes": round(start.elapsed_time(end) / 20, 4), "max_abs_vs_fp32_convT_last": err}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.batch, args.dtype)))
        return 0
    rows = []
    for r in range(args.rounds):                              # A/B/C/D, A/B/C/D: each in a fresh process
        for v in VARIANTS:
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, __file__, "--child", v, "--batch", str(args.batch), "--dtype",
                                  args.dtype], capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else \
                {"variant": v, "error": out.stderr[-800:]}
            row |= {"round": r + 1, "process_s": round(time.perf_counter() - t0, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    import torch

    res = {"benchmark": "skip_upsample", "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
           "torch": torch.__version__, "batch": args.batch, "dtype": args.dtype, "rows": rows}
    print(f"wrote {write_result(args.out, f'skip_upsample_bs{args.batch}', res)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
