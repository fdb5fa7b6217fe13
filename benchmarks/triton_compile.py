"""What a first-ever run pays to compile the fused generator's Triton kernels, measured on the host (no GPU needed).

The generator runs once on the CPU with its Triton wrappers recording each launch instead of running it; each distinct
specialization is then compiled for a GPU target (default sm_90, the H100/H200) from an empty cache, one after another
and on threads. `--specialize-sizes` compiles the launches as they were before the per-layer sizes were left
unspecialized (one kernel per "divisible by 16" / "== 1" class of H, W, ...), the form this is measured against.

    python benchmarks/triton_compile.py --model GPEN-BFR-512 --dtype bf16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from results_file import write_result  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def launches(model_name: str, dtype: torch.dtype) -> list[tuple]:
    """(kernel, args, constexprs) of every Triton launch of one forward at batch 2."""
    torch.cuda.is_available = lambda: True      # the kernels are defined where a GPU could run them: compile only
    from gpen_tune.load import load_model
    from gpen_tune.model.fused import fuse
    from gpen_tune.ops import modconv_epilogue_triton as T

    calls: list[tuple] = []
    T.launch = lambda kernel, grid, *args, **meta: calls.append(
        (kernel, args, {k: v for k, v in meta.items() if k != "num_warps"}))
    model = fuse(load_model("synthetic", model_name), dtype, impl="torch")
    model._use_triton = True                    # the ToRGB GEMV takes its kernel too
    with torch.inference_mode():
        model._run(torch.rand(2, 3, model.size, model.size) * 2 - 1, True)
    return calls


def source(kernel, args: tuple, meta: dict, specialize_sizes: bool):
    """The kernel's compile source for these arguments, as Triton's launcher would specialize it; and its key."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.compiler import ASTSource

    sig, const, attrs, key = {}, {}, {}, [kernel.fn.__name__]
    for i, name in enumerate(kernel.arg_names):
        if name in meta:
            sig[name], const[(i,)] = "constexpr", meta[name]
        elif isinstance(args[i], torch.Tensor):
            sig[name], attrs[(i,)] = "*" + TRITON_TYPES[args[i].dtype], [["tt.divisibility", 16]]
        elif isinstance(args[i], float):
            sig[name] = "fp32"
        elif name in kernel.do_not_specialize and not specialize_sizes:
            sig[name] = "i32"
        else:
            kind, spec = native_specialize_impl(BaseBackend, args[i], False, True, True)
            if kind == "constexpr":
                sig[name], const[(i,)] = "constexpr", args[i]
            else:
                sig[name] = kind
                if spec == "D":
                    attrs[(i,)] = [["tt.divisibility", 16]]
        key.append(f"{name}:{sig[name]}:{const.get((i,), '')}:{bool(attrs.get((i,)))}")
    return tuple(key), ASTSource(kernel, sig, constexprs=const, attrs=attrs)


def compile_all(sources: list, arch: int, threads: int) -> tuple[float, list[float]]:
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile

    knobs.cache.dir = tempfile.mkdtemp(prefix="gpen-triton-compile-")      # an empty cache: a first-ever run
    target = GPUTarget("cuda", arch, 32)

    def one(src) -> float:
        t = time.perf_counter()
        triton_compile(src, target=target, options={"num_warps": 4})
        return time.perf_counter() - t

    t0 = time.perf_counter()
    if threads <= 1:
        each = [one(s) for s in sources]
    else:
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(one, sources))
    return time.perf_counter() - t0, each


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="GPEN-BFR-512")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--arch", type=int, default=90, help="the GPU's compute capability x10 (90: H100/H200)")
    ap.add_argument("--threads", type=int, default=8, help="as the generator's first call compiles (COMPILE_THREADS)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    calls = launches(args.model, DTYPES[args.dtype])
    forms = {}
    for form, specialize in (("sizes specialized (before)", True), ("sizes not specialized", False)):
        unique: dict = {}
        for kernel, a, meta in calls:
            key, src = source(kernel, a, meta, specialize)
            unique.setdefault(key, src)
        serial, each = compile_all(list(unique.values()), args.arch, 1)
        parallel, _ = compile_all(list(unique.values()), args.arch, args.threads)
        forms[form] = {"kernels": len(unique), "serial_s": round(serial, 3), "each_s": [round(x, 3) for x in each],
                       f"threads_{args.threads}_s": round(parallel, 3)}
        print(f"{form}: {len(unique)} kernels, {serial:.2f} s one after another, {parallel:.2f} s on "
              f"{args.threads} threads", flush=True)
    import triton

    path = write_result(args.out, f"triton_compile_{args.model}_{args.dtype}", {
        "benchmark": "triton_compile", "command": "python " + " ".join(sys.argv), "model": args.model,
        "dtype": args.dtype, "target": f"sm_{args.arch}", "launches_per_forward": len(calls), "forms": forms,
        "host_cores": os.cpu_count(), "triton": triton.__version__, "torch": torch.__version__})
    print(path)


if __name__ == "__main__":
    main()
