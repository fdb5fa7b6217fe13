"""The generator variants `generator_limit.py` times, and how each is built: the upstream formulation, our model as
is, the fused fast path (Triton or PyTorch epilogues), each in fp32/bf16/fp16, with CUDA graphs or torch.compile."""

from __future__ import annotations

import copy

import torch

from gpen_tune.model.fused import fuse
from gpen_tune.model.reference import reference_forward

# name -> how to build it. kind: reference | model (FullGenerator as is) | fused (gpen_tune.model.fused.fuse)
VARIANTS: dict[str, dict] = {
    "reference_fp32": dict(kind="reference", dtype="fp32"),
    "model_fp32": dict(kind="model", dtype="fp32"),
    "fused_bf16_triton": dict(kind="fused", dtype="bf16", flags=dict(impl="triton"), cuda=True),
    "fused_bf16_triton_graph": dict(kind="fused", dtype="bf16", flags=dict(impl="triton"), graph=True, cuda=True),
    "fused_fp16_triton": dict(kind="fused", dtype="fp16", flags=dict(impl="triton"), cuda=True),
    "fused_fp16_triton_graph": dict(kind="fused", dtype="fp16", flags=dict(impl="triton"), graph=True,
                                    cuda=True),
    "fused_bf16_triton_nobench": dict(kind="fused", dtype="bf16", flags=dict(impl="triton"), cuda=True,
                                      cudnn_benchmark=False),
    "fused_bf16_torch": dict(kind="fused", dtype="bf16", flags=dict(impl="torch")),
    "fused_fp32_triton": dict(kind="fused", dtype="fp32", flags=dict(impl="triton"), cuda=True),
    "fused_bf16_compile": dict(kind="fused", dtype="bf16", flags=dict(impl="torch"), compile=True,
                               min_left_s=120),
    "fused_bf16_compile_graph": dict(kind="fused", dtype="bf16", flags=dict(impl="torch"), compile=True,
                                     graph=True, min_left_s=90),
    "model_bf16_compile": dict(kind="model", dtype="bf16", compile=True, min_left_s=90),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def plan(quick: bool, tiny: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    """(model key, variant, batch sizes), most important first (the time budget cuts from the end)."""
    if tiny:
        b = (1, 2)
        return [("main", v, b) for v in
                ("reference_fp32", "model_fp32", "fused_bf16_triton", "fused_bf16_torch",
                 "fused_bf16_compile")] + [("small", "reference_fp32", (1,)), ("small", "fused_bf16_torch", (1,))]
    big = (1, 4, 16, 32, 64, 128)
    graph_b = (1, 4, 16)
    if quick:  # the default path, no compile rows; ~150 s on an H200
        return [
            ("main", "reference_fp32", (1, 16)),
            ("main", "fused_bf16_triton", (1, 4, 16, 64, 128)),
            ("main", "fused_bf16_triton_graph", (1, 4)),
            ("main", "fused_fp16_triton", (64,)),
            ("main", "fused_fp32_triton", (1,)),
        ]
    return [
        ("main", "reference_fp32", (1, 4, 16)),
        ("main", "fused_bf16_triton", big),
        ("main", "fused_fp32_triton", (1, 16)),
        ("main", "fused_bf16_triton_graph", graph_b),
        ("main", "fused_fp16_triton", big),
        ("main", "fused_fp16_triton_graph", (1, 4)),
        ("main", "fused_bf16_triton_nobench", (1, 4, 64)),
        ("main", "model_fp32", (1, 4, 16)),
        ("main", "fused_bf16_torch", (1, 16, 64)),
        ("small", "reference_fp32", (1, 16)),
        ("small", "fused_bf16_triton", (1, 16, 64, 128)),
        ("small", "fused_bf16_triton_graph", (1, 16)),
        ("large", "reference_fp32", (1, 4)),
        ("large", "fused_bf16_triton", (1, 4, 16, 32)),
        ("large", "fused_bf16_triton_graph", (1,)),
        ("main", "fused_bf16_compile", (1, 16, 64, 128)),
        ("main", "fused_bf16_compile_graph", (1,)),
        ("main", "model_bf16_compile", (1, 64)),
    ]


def build_variant(name: str, master, device: torch.device):
    spec = VARIANTS[name]
    dtype = DTYPES[spec["dtype"]]
    if spec.get("cuda") and device.type != "cuda":
        raise SkipRow("needs CUDA (Triton kernels)")
    if spec["kind"] == "reference":
        m = copy.deepcopy(master).to(device)
        return lambda x: reference_forward(m, x)
    if spec["kind"] == "model":
        m = copy.deepcopy(master)
        if dtype != torch.float32:
            from gpen_tune.tune.amp import cast_model

            m = cast_model(m, dtype)
        m = m.to(device)
    else:
        m = fuse(master, dtype, **spec.get("flags", {})).to(device)
    if spec.get("compile"):
        m = torch.compile(m)
    return m


class SkipRow(Exception):
    pass
