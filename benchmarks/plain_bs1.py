"""Batch-1 latency of the plain (non-fused) generator, eager vs CUDA-graph replay, and where the GPU time goes.

The `--cuda-graph` target is "bs1 with graphs at most half the eager bs1 time". A graph removes the CPU's
launch cost, not the GPU's work, so the ratio is decided by how much GPU time one bs1 forward needs. This script
measures, in one process and on the same weights and input:
  * eager and graph-replay ms at batch 1 (median of --repeats, CUDA events) for fp32 (TF32 convs) and bf16,
  * the current model with its default FIR dispatch ("after": Triton under capture and for big tensors; the
    all-PyTorch and all-Triton dispatches were measured against it in plain_bs1_20261130T222113Z and dropped),
  * optionally the same for an earlier formulation of the model (`--before DIR` holding its layers.py, gpen.py and
    fir.py), so a change to the model is measured against its baseline in the same run,
  * a kernel-level profile (torch.profiler) of one eager bs1 forward: the top kernels by GPU time, and totals.

    python benchmarks/plain_bs1.py --model GPEN-BFR-512 --out benchmarks/results [--before bl_model]
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from timing import Stopwatch, summary, time_calls  # noqa: E402

from gpen_tune.load import load_model  # noqa: E402
from gpen_tune.tune.amp import cast_model  # noqa: E402
from gpen_tune.tune.cuda_graph import GraphedForward  # noqa: E402


def load_before(directory: Path):
    """FullGenerator class of an earlier formulation (layers.py, gpen.py, fir.py), imported under a private name."""
    pkg = Path(tempfile.mkdtemp()) / "before_model"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in ("layers.py", "gpen.py", "fir.py"):
        text = (directory / name).read_text()
        text = text.replace("gpen_tune.model.layers", "before_model.layers").replace("gpen_tune.ops.fir",
                                                                                      "before_model.fir")
        (pkg / name).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    return importlib.import_module("before_model.gpen").FullGenerator


class _ChannelsLastWeights:
    """Experiment (variant "after_cl_weights"): batch-1 modulated weights of the non-upsampling convs made from a
    channels-last copy of the base weight, so they are NHWC as cuDNN's TF32/bf16 kernels want them. Hypothesis from
    the bs1 profile: 39 nchwToNhwc + 20 nhwcToNchw copies for ~20 convs = input + weight in, output back, the
    modulated weight (a new tensor each call) converted every call. PyTorch then runs the conv channels-last
    (its own input copy) and the output is made NCHW again, so only the weight conversion should disappear."""

    def __init__(self, mod, keep_layout: bool = False):
        self.mod, self.orig, self.keep_layout = mod, mod._forward_single, keep_layout
        self.w_cl = mod.weight[0].detach().contiguous(memory_format=torch.channels_last)

    def __call__(self, x, style, d, bias, gain):
        m = self.mod
        if m.upsample:
            return self.orig(x, style, d, bias, gain)
        s = style[0] * (m.weight_gain * gain)
        coef = s[None, :] if d is None else d[0, :, None] * s[None, :]
        weight = (self.w_cl * coef.to(self.w_cl.dtype)[:, :, None, None]).to(x.dtype)   # stays channels-last
        y = F.conv2d(x, weight, bias, padding=m.padding)
        return y if self.keep_layout else y.contiguous()


class _StyledConvNHWC:
    """Experiment (variant "after_nhwc"): StyledConv's concatenation buffer in the layout of the conv output."""

    def __init__(self, mod):
        self.mod = mod

    def __call__(self, x, w, noise):
        from gpen_tune.model.layers import LRELU_SLOPE, SQRT2

        m = self.mod
        c = m.conv.out_channel
        bias = (m.activate.bias * SQRT2).to(x.dtype)
        y = m.conv(x, w, bias=bias[:c], gain=SQRT2)
        out = torch.empty((1, 2 * c, *y.shape[2:]), dtype=y.dtype, device=y.device,
                          memory_format=torch.channels_last)
        out[:, :c].copy_(y)
        del y
        out[:, c:].copy_(noise).mul_(m.noise.weight.to(out.dtype) * SQRT2).add_(bias[None, c:, None, None])
        return F.leaky_relu(out, LRELU_SLOPE, inplace=True)


class _ConvLayerNHWC:
    """Experiment (variant "after_nhwc"): encoder conv weight scaled from a channels-last copy."""

    def __init__(self, mod):
        from gpen_tune.model.layers import SQRT2

        self.mod = mod
        *_, conv, act = mod
        self.pre = list(mod)[:-2]
        self.conv = conv
        self.w_cl = (conv.weight.detach() * (conv.scale * SQRT2)).contiguous(memory_format=torch.channels_last)
        self.bias = (act.bias.detach() * SQRT2)

    def __call__(self, x):
        from gpen_tune.model.layers import LRELU_SLOPE

        for m in self.pre:
            x = m(x)
        y = F.conv2d(x, self.w_cl.to(x.dtype), self.bias.to(x.dtype), stride=self.conv.stride,
                     padding=self.conv.padding)
        return F.leaky_relu(y, LRELU_SLOPE, inplace=True)


def build(variant: str, model: str, dtype: torch.dtype, before_cls, device: torch.device) -> torch.nn.Module:
    net = load_model("synthetic", model=model, device=device)
    if variant == "before":
        old = before_cls(net.cfg)
        old.load_state_dict(net.state_dict(), strict=True)
        net = old.to(device).eval().requires_grad_(False)
    net = cast_model(net, dtype) if dtype != torch.float32 else net
    if variant in ("after_cl_weights", "after_nhwc"):
        from gpen_tune.model.layers import ConvLayer, ModulatedConv2d, StyledConv

        for mod in net.modules():
            if isinstance(mod, ModulatedConv2d):
                mod._forward_single = _ChannelsLastWeights(mod, keep_layout=variant == "after_nhwc")
            if variant == "after_nhwc" and isinstance(mod, StyledConv):
                mod.forward = _StyledConvNHWC(mod)
            if variant == "after_nhwc" and isinstance(mod, ConvLayer):
                mod.forward = _ConvLayerNHWC(mod)
    if variant == "after_nhwc":   # the input goes in channels-last, so every activation stays NHWC
        inner = net.forward
        net.forward = lambda x: inner(x.contiguous(memory_format=torch.channels_last))
    return net


def profile_forward(fn, x: torch.Tensor, top: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn(x)
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels.setdefault(e.name, []).append(e.device_time_total if hasattr(e, "device_time_total")
                                                   else e.cuda_time_total)
    rows = sorted(((sum(v), len(v), k) for k, v in kernels.items()), reverse=True)
    total = sum(r[0] for r in rows)
    return {
        "kernels": sum(r[1] for r in rows),
        "gpu_us_total": round(total, 1),
        "top": [{"us": round(us, 1), "calls": n, "share": round(us / total, 4), "kernel": k[:160]}
                for us, n, k in rows[:top]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--before", type=Path, default=None, help="directory with an earlier layers.py/gpen.py/fir.py")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--experiments", nargs="*", default=[],
                    choices=["after_cl_weights", "after_nhwc"],
                    help="extra variants (measured 2026-12-01, plain_bs1_20261201T022420Z: channels-last weights "
                         "5.24 and whole-model NHWC 9.49 ms graph fp32 vs 4.87 for 'after': both slower)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    before_cls = load_before(args.before) if args.before else None
    size = int(args.model.rsplit("-", 1)[-1])
    x = torch.rand(1, 3, size, size, device=device) * 2 - 1
    variants = (["before"] if before_cls else []) + ["after"] + args.experiments
    results, reference = [], {}
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for variant in variants:
            net = build(variant, args.model, dtype, before_cls, device)
            with torch.inference_mode():
                for _ in range(3):
                    out = net(x)
                eager = summary(time_calls(partial(net, x), device, args.repeats))
                graphed = GraphedForward(net, buckets=(1,))
                with Stopwatch(device) as capture:
                    g_out = graphed(x)
                capture_s = capture.seconds
                graph = summary(time_calls(partial(graphed, x), device, args.repeats))
                ref = reference.setdefault(dtype_name, out.float())
                row = {
                    "variant": variant, "dtype": dtype_name,
                    "eager_ms": round(eager["median_ms"], 3), "graph_ms": round(graph["median_ms"], 3),
                    "graph_over_eager": round(graph["median_ms"] / eager["median_ms"], 3),
                    "eager_rel_iqr": round(eager["rel_iqr"], 3), "graph_rel_iqr": round(graph["rel_iqr"], 3),
                    "capture_s": round(capture_s, 2),
                    "max_abs_vs_first_variant": float((out.float() - ref).abs().max()),
                    "graph_equals_eager": bool(torch.equal(g_out, out)),
                }
                if variant.startswith("after") or dtype_name == "fp32":
                    row["profile_eager_bs1"] = profile_forward(net, x, args.top)
            print(json.dumps({k: v for k, v in row.items() if k != "profile_eager_bs1"}), flush=True)
            results.append(row)
            del net, graphed
            torch.cuda.empty_cache()
    record = {
        "benchmark": "plain_bs1",
        "command": "python benchmarks/plain_bs1.py " + shlex.join(sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": args.model, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "cudnn_benchmark": True, "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "rows": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = args.out / f"plain_bs1_{stamp}_{args.model}.json"
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")
    for r in results:
        prof = r.get("profile_eager_bs1")
        if prof:
            print(f"\n{r['variant']} {r['dtype']}: {prof['kernels']} kernels, {prof['gpu_us_total']:.0f} us GPU")
            for t in prof["top"][:15]:
                print(f"  {t['us']:8.1f} us {t['calls']:4d}x {100 * t['share']:5.1f}%  {t['kernel'][:110]}")


if __name__ == "__main__":
    main()
